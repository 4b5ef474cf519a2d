//! Resolving candidates: placeholders already in the text, then overlaps (see the module
//! documentation of [`super`]).

use std::sync::LazyLock;

use super::SecretKind;

// Lower wins when two candidates of equal width overlap: the more specific rule names the kind.
pub(super) const PRIO_PEM: u8 = 0;
pub(super) const PRIO_AUTHZ: u8 = 1;
pub(super) const PRIO_BEARER: u8 = 2;
pub(super) const PRIO_JWT: u8 = 3;
pub(super) const PRIO_AWS_ID: u8 = 4;
pub(super) const PRIO_PROVIDER: u8 = 5;
pub(super) const PRIO_KV_NAMED: u8 = 6;
pub(super) const PRIO_KV: u8 = 7;
pub(super) const PRIO_CONN: u8 = 8;
pub(super) const PRIO_CARD: u8 = 9;
pub(super) const PRIO_EMAIL: u8 = 10;
pub(super) const PRIO_CUSTOM: u8 = 11;

const PLACEHOLDER_PREFIX: &[u8] = b"[REDACTED:";

static PLACEHOLDER: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(PLACEHOLDER_PREFIX));

#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate {
    start: usize,
    end: usize,
    kind: SecretKind,
    prio: u8,
}

pub(super) fn push(
    found: &mut Vec<Candidate>,
    start: usize,
    end: usize,
    kind: SecretKind,
    prio: u8,
) {
    if start < end {
        found.push(Candidate {
            start,
            end,
            kind,
            prio,
        });
    }
}

/// Removes existing placeholders from the candidates, which is what makes redaction
/// idempotent: a candidate inside a placeholder is dropped, one that straddles a placeholder
/// keeps only its parts outside it that still hold an alphanumeric character.
pub(super) fn exclude_placeholders(s: &str, found: &mut Vec<Candidate>) {
    let b = s.as_bytes();
    let guards: Vec<(usize, usize)> = PLACEHOLDER
        .find_iter(b)
        .map(|start| {
            let after = start + PLACEHOLDER_PREFIX.len();
            let end = memchr::memchr(b']', &b[after..]).map_or(after, |i| after + i + 1);
            (start, end)
        })
        .collect();
    if guards.is_empty() {
        return;
    }
    let mut kept = Vec::with_capacity(found.len());
    for c in found.drain(..) {
        let mut start = c.start;
        for &(g_start, g_end) in &guards {
            if g_end <= start || g_start >= c.end {
                continue;
            }
            if g_start > start {
                keep_part(
                    b,
                    &mut kept,
                    Candidate {
                        start,
                        end: g_start,
                        ..c
                    },
                );
            }
            start = start.max(g_end);
        }
        if start < c.end {
            keep_part(b, &mut kept, Candidate { start, ..c });
        }
    }
    *found = kept;
}

fn keep_part(b: &[u8], kept: &mut Vec<Candidate>, c: Candidate) {
    if b[c.start..c.end].iter().any(|x| x.is_ascii_alphanumeric()) {
        kept.push(c);
    }
}

/// A merged range and the kind it is reported as.
#[derive(Debug, Clone, Copy)]
pub(super) struct Merged {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) kind: SecretKind,
    /// Width and priority of the candidate that named `kind`.
    best: (usize, u8),
}

/// Turns overlapping candidates into disjoint ranges sorted by start: see the module doc.
pub(super) fn resolve(mut found: Vec<Candidate>) -> Vec<Merged> {
    found.sort_by_key(|c| (c.prio, c.start, std::cmp::Reverse(c.end)));
    let mut accepted: Vec<Candidate> = Vec::with_capacity(found.len());
    'next: for c in found {
        let mut partial = false;
        for a in &accepted {
            if c.start >= a.start && c.end <= a.end {
                continue 'next;
            }
            partial |= c.start < a.end && a.start < c.end;
        }
        if partial && c.kind == SecretKind::Email {
            continue;
        }
        accepted.push(c);
    }
    accepted.sort_by_key(|c| c.start);
    let mut merged: Vec<Merged> = Vec::with_capacity(accepted.len());
    for c in accepted {
        let width = c.end - c.start;
        if let Some(last) = merged.last_mut() {
            if c.start < last.end {
                last.end = last.end.max(c.end);
                if width > last.best.0 || width == last.best.0 && c.prio < last.best.1 {
                    last.kind = c.kind;
                    last.best = (width, c.prio);
                }
                continue;
            }
        }
        merged.push(Merged {
            start: c.start,
            end: c.end,
            kind: c.kind,
            best: (width, c.prio),
        });
    }
    merged
}
