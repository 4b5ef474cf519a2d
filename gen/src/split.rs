//! Traces in pieces, as real exporters send them: whole, one span per request in
//! random order, pairs of spans children first, and the tool side of each call (its execute
//! and parse stages) apart from the agent side, as a tool service in a second process exports
//! them.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// How a request is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// As generated: every span of a trace in one request.
    Whole,
    /// One span per request, in random order.
    SpanRandom,
    /// Two spans per request, children first (in end-time order, as exporters send them).
    PairsChildrenFirst,
}

impl Split {
    /// Parses `whole`, `span-random`, `pairs-children-first`.
    pub fn parse(s: &str) -> Option<Split> {
        match s {
            "whole" => Some(Split::Whole),
            "span-random" => Some(Split::SpanRandom),
            "pairs-children-first" => Some(Split::PairsChildrenFirst),
            _ => None,
        }
    }
}

/// Which spans of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Every span.
    All,
    /// All but the tool side.
    Agent,
    /// The tool side: execute and parse stage spans (what a tool service exports itself).
    Tool,
}

impl Part {
    /// Parses `all`, `agent`, `tool`.
    pub fn parse(s: &str) -> Option<Part> {
        match s {
            "all" => Some(Part::All),
            "agent" => Some(Part::Agent),
            "tool" => Some(Part::Tool),
            _ => None,
        }
    }
}

fn is_tool_side(s: &Span) -> bool {
    s.attributes.iter().any(|kv| {
        kv.key == "toolspan.stage"
            && matches!(
                kv.value.as_ref().and_then(|v| v.value.as_ref()),
                Some(Value::StringValue(v)) if v == "execute" || v == "parse"
            )
    })
}

/// `req`'s spans of `part`, cut as `split` says; random orders come from `seed`.
pub fn pieces(
    req: &ExportTraceServiceRequest,
    split: Split,
    part: Part,
    seed: u64,
) -> Vec<ExportTraceServiceRequest> {
    // (resource spans, scope spans, span) of every kept span.
    let mut spans: Vec<(usize, usize, &Span)> = Vec::new();
    for (r, rs) in req.resource_spans.iter().enumerate() {
        for (c, ss) in rs.scope_spans.iter().enumerate() {
            for s in &ss.spans {
                let keep = match part {
                    Part::All => true,
                    Part::Agent => !is_tool_side(s),
                    Part::Tool => is_tool_side(s),
                };
                if keep {
                    spans.push((r, c, s));
                }
            }
        }
    }
    let chunk = match split {
        Split::Whole => spans.len().max(1),
        Split::SpanRandom => {
            spans.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
            1
        }
        Split::PairsChildrenFirst => {
            let parent: HashMap<&[u8], &[u8]> = spans
                .iter()
                .map(|(_, _, s)| (s.span_id.as_slice(), s.parent_span_id.as_slice()))
                .collect();
            let depth = |id: &[u8]| {
                let (mut d, mut cur) = (0u64, id);
                while let Some(p) = parent.get(cur).filter(|p| !p.is_empty() && d < 256) {
                    d += 1;
                    cur = p;
                }
                d
            };
            spans.sort_by_key(|(_, _, s)| (s.end_time_unix_nano, u64::MAX - depth(&s.span_id)));
            2
        }
    };
    spans
        .chunks(chunk)
        .map(|group| {
            let mut out = ExportTraceServiceRequest::default();
            for &(r, c, s) in group {
                let rs = &req.resource_spans[r];
                let ss = &rs.scope_spans[c];
                out.resource_spans.push(ResourceSpans {
                    resource: rs.resource.clone(),
                    scope_spans: vec![ScopeSpans {
                        scope: ss.scope.clone(),
                        spans: vec![s.clone()],
                        schema_url: ss.schema_url.clone(),
                    }],
                    schema_url: rs.schema_url.clone(),
                });
            }
            out
        })
        .filter(|r| !r.resource_spans.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fleet, FleetConfig};

    #[test]
    fn every_shape_keeps_every_span_once() {
        let mut fleet = Fleet::new(FleetConfig {
            seed: 1,
            payloads: false,
            failure_scale: 2.0,
        });
        let req = fleet.request(1, 1_764_410_400_000_000_000, 0);
        let ids = |rs: &[ExportTraceServiceRequest]| {
            let mut v: Vec<Vec<u8>> = rs
                .iter()
                .flat_map(|r| &r.resource_spans)
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
                .map(|s| s.span_id.clone())
                .collect();
            v.sort();
            v
        };
        let all = ids(std::slice::from_ref(&req));
        for split in [Split::Whole, Split::SpanRandom, Split::PairsChildrenFirst] {
            let p = pieces(&req, split, Part::All, 7);
            assert_eq!(ids(&p), all, "{split:?}");
            let mut both = ids(&pieces(&req, split, Part::Agent, 7));
            let tool = ids(&pieces(&req, split, Part::Tool, 7));
            assert!(!tool.is_empty());
            both.extend(tool);
            both.sort();
            assert_eq!(both, all, "{split:?}: agent + tool side");
        }
        assert_eq!(
            pieces(&req, Split::SpanRandom, Part::All, 7).len(),
            all.len()
        );
    }
}
