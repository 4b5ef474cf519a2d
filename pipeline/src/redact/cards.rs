//! Card numbers: a vectorised prefilter, then issuer prefixes, lengths and the Luhn check.

use super::resolve::{push, Candidate, PRIO_CARD};
use super::SecretKind;

/// Cheap test that `b` may hold a card number: a run of at least 13 bytes that are digits or
/// single spaces or dashes between digits. Works on 64-byte blocks turned into bit masks (the
/// byte compares vectorise), so a digit-heavy but card-free string such as an ISO timestamp or a
/// hex trace id costs a few instructions per block rather than a branch per byte.
pub(super) fn may_hold_card(b: &[u8]) -> bool {
    if b.len() < 64 {
        // One block at most: a plain digit count rejects nearly every short string sooner.
        if b.iter().filter(|c| c.is_ascii_digit()).count() < 13 {
            return false;
        }
    }
    // Length of the run of qualifying bytes that ends the previous block.
    let mut carry = 0u32;
    for chunk in b.chunks(64) {
        let mut block = [0u8; 64];
        block[..chunk.len()].copy_from_slice(chunk);
        let (digits, seps) = block_masks(&block);
        // A separator counts only between two digits; at the block edges the neighbour is
        // unknown, so it counts (over-approximating is safe for a prefilter).
        let seps = seps & ((digits << 1) | 1) & ((digits >> 1) | (1 << 63));
        let run = digits | seps;
        if carry + run.trailing_ones() >= 13 || has_run_of_13(run) {
            return true;
        }
        carry = if run == u64::MAX {
            carry + 64
        } else {
            run.leading_ones()
        };
    }
    false
}

/// Bit `i` of the first mask is set when `block[i]` is a digit, of the second when it is a
/// space or a dash.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn block_masks(block: &[u8; 64]) -> (u64, u64) {
    // SAFETY: the cfg above guarantees that this build enables SSE2 (it is part of the x86_64
    // baseline), the only requirement of `block_masks_sse2`.
    unsafe { block_masks_sse2(block) }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn block_masks_sse2(block: &[u8; 64]) -> (u64, u64) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_sub_epi8,
    };
    let mut digits = 0u64;
    let mut seps = 0u64;
    for (i, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: the unaligned load reads exactly the 16 bytes of `chunk`.
        let v = unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) };
        // A digit is a byte whose distance above b'0' is at most 9 (unsigned).
        let above_zero = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let d = _mm_cmpeq_epi8(_mm_min_epu8(above_zero, _mm_set1_epi8(9)), above_zero);
        let s = _mm_or_si128(
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8)),
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'-' as i8)),
        );
        // The movemask results are 16-bit masks in an i32: the casts only reinterpret them.
        digits |= u64::from(_mm_movemask_epi8(d) as u16) << (16 * i);
        seps |= u64::from(_mm_movemask_epi8(s) as u16) << (16 * i);
    }
    (digits, seps)
}

/// Bit `i` of the first mask is set when `block[i]` is a digit, of the second when it is a
/// space or a dash.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline]
fn block_masks(block: &[u8; 64]) -> (u64, u64) {
    let mut digits = 0u64;
    let mut seps = 0u64;
    for (i, &c) in block.iter().enumerate() {
        digits |= u64::from(c.is_ascii_digit()) << i;
        seps |= u64::from(c == b' ' || c == b'-') << i;
    }
    (digits, seps)
}

/// True when `m` has at least 13 consecutive set bits.
#[inline]
fn has_run_of_13(m: u64) -> bool {
    let m2 = m & (m >> 1); // runs of 2
    let m4 = m2 & (m2 >> 2); // runs of 4
    let m8 = m4 & (m4 >> 4); // runs of 8
    m8 & (m8 >> 5) != 0 // runs of 13
}

/// Finds card numbers: 13–19 digits, optionally in groups separated by single spaces or dashes,
/// with a known issuer prefix and length, a valid Luhn check digit, and not one repeated digit.
/// A digit group glued to letters, `_` or `.` (hex ids, decimals) is never part of a card.
pub(super) fn find_cards(b: &[u8], found: &mut Vec<Candidate>) {
    // Groups of the current run, as (start, end). A card spans at most 6 groups, so a long run
    // is examined in batches that keep the last groups for the next batch.
    const MAX_GROUPS: usize = 32;
    const KEEP: usize = 6;
    let glued = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut groups = [(0usize, 0usize); MAX_GROUPS];
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        // A group glued to a word or a decimal point is part of that token, not of a card; the
        // groups after a separator are still examined.
        let mut skip_group = i > 0 && (glued(b[i - 1]) || b[i - 1] == b'.');
        let mut n = 0;
        loop {
            let g_start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let more =
                i + 1 < b.len() && (b[i] == b' ' || b[i] == b'-') && b[i + 1].is_ascii_digit();
            let glued_after = !more
                && i < b.len()
                && (glued(b[i]) || b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit());
            if !std::mem::take(&mut skip_group) && !glued_after {
                groups[n] = (g_start, i);
                n += 1;
            }
            if !more {
                cards_in_run(b, &groups[..n], n, found);
                break;
            }
            i += 1;
            if n == MAX_GROUPS {
                let next = cards_in_run(b, &groups[..n], n - KEEP, found);
                groups.copy_within(next..n, 0);
                n -= next;
            }
        }
    }
}

/// Tries group-aligned sub-runs of one digit run that start before group `start_limit`,
/// leftmost and longest first: a single group of 13–19 digits, or two or more groups of 3–6
/// digits each. Returns the index of the first group not yet examined or consumed.
fn cards_in_run(
    b: &[u8],
    groups: &[(usize, usize)],
    start_limit: usize,
    found: &mut Vec<Candidate>,
) -> usize {
    let mut first = 0;
    while first < start_limit.min(groups.len()) {
        let mut matched = None;
        for last in (first..groups.len().min(first + 7)).rev() {
            let parts = &groups[first..=last];
            let digits: usize = parts.iter().map(|(s, e)| e - s).sum();
            if !(13..=19).contains(&digits) {
                continue;
            }
            if parts.len() > 1 && parts.iter().any(|(s, e)| !(3..=6).contains(&(e - s))) {
                continue;
            }
            let mut number = [0u8; 19];
            let mut n = 0;
            for &(s, e) in parts {
                for &c in &b[s..e] {
                    number[n] = c - b'0';
                    n += 1;
                }
            }
            if is_card_number(&number[..n]) {
                matched = Some(last);
                break;
            }
        }
        match matched {
            Some(last) => {
                push(
                    found,
                    groups[first].0,
                    groups[last].1,
                    SecretKind::CardNumber,
                    PRIO_CARD,
                );
                first = last + 1;
            }
            None => first += 1,
        }
    }
    first
}

/// Issuer prefix and length (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay), not a
/// single repeated digit, and a valid Luhn check digit. Prefixes rule out nanosecond and
/// millisecond timestamps, which start with `1`.
fn is_card_number(d: &[u8]) -> bool {
    let len = d.len();
    if d.iter().all(|&x| x == d[0]) {
        return false;
    }
    let prefix = |n: usize| d[..n].iter().fold(0u32, |acc, &x| acc * 10 + u32::from(x));
    let issuer_ok = match d[0] {
        4 => matches!(len, 13 | 16 | 19),
        5 => (51..=55).contains(&prefix(2)) && len == 16,
        2 => (2221..=2720).contains(&prefix(4)) && len == 16,
        3 => {
            let p2 = prefix(2);
            let p3 = prefix(3);
            (p2 == 34 || p2 == 37) && len == 15
                || (3528..=3589).contains(&prefix(4)) && (16..=19).contains(&len)
                || ((300..=305).contains(&p3) || p2 == 36 || p2 == 38) && (14..=19).contains(&len)
        }
        6 => {
            let p2 = prefix(2);
            let p3 = prefix(3);
            (prefix(4) == 6011 || p2 == 65 || (644..=649).contains(&p3) || p2 == 62)
                && (16..=19).contains(&len)
        }
        _ => false,
    };
    issuer_ok && luhn(d)
}

fn luhn(d: &[u8]) -> bool {
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            let x = u32::from(x);
            if i % 2 == 1 {
                let y = x * 2;
                if y > 9 {
                    y - 9
                } else {
                    y
                }
            } else {
                x
            }
        })
        .sum();
    sum.is_multiple_of(10)
}
