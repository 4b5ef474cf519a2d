//! Answer shapes on `/metrics` (METRICS.md, "Answer shapes"): each tool's answers by shape,
//! the share of its recent answers by shape, and new-shape events.
//!
//! A call's answer is the raw answer a `send` or `execute` stage recorded (its
//! `output_shape`), or else the result of a call that did not fail, as the `answer_shapes`
//! view reads them. Memory is bounded: tools are the capped `tool` labels, each keeps at most
//! [`MAX_SHAPES_PER_TOOL`] shape labels (later shapes are `__other__`), its last
//! [`SHARE_WINDOW`] answers and at most [`MAX_REMEMBERED`] shapes it has seen.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::series::{Labels, OTHER};

/// Shape label values a tool keeps before later shapes become `__other__`.
pub const MAX_SHAPES_PER_TOOL: usize = 10;
/// The share gauge is over a tool's last this many answers.
pub const SHARE_WINDOW: usize = 100;
/// A shape first seen after the tool's first this many answers is a new-shape event (the
/// first answers are the tool's baseline).
pub const BASELINE_ANSWERS: u64 = 10;
/// Shapes remembered per tool; once full, an unseen shape is not an event.
pub const MAX_REMEMBERED: usize = 1024;

type Share = Gauge<f64, AtomicU64>;

/// The families and what each tool's answers looked like.
pub struct AnswerShapes {
    answers: Family<Labels, Counter>,
    share: Family<Labels, Share>,
    new_shapes: Family<Labels, Counter>,
    tools: HashMap<String, ToolShapes>,
}

#[derive(Default)]
struct ToolShapes {
    answers: u64,
    remembered: HashSet<String>,
    labelled: Vec<String>,
    recent: VecDeque<String>,
    counts: HashMap<String, usize>,
}

fn labels(tool: &str, shape: &str) -> Labels {
    vec![("tool", tool.to_string()), ("shape", shape.to_string())]
}

impl AnswerShapes {
    /// Registers the three families on `registry`.
    pub fn register(registry: &mut Registry) -> AnswerShapes {
        let answers = Family::<Labels, Counter>::default();
        registry.register(
            "toolspan_tool_answer_shapes",
            "Tool answers by shape (the shape id of the raw answer a send or execute stage recorded, or of a call's result when it did not fail)",
            answers.clone(),
        );
        let share = Family::<Labels, Share>::default();
        registry.register(
            "toolspan_tool_answer_shape_share",
            "Share of each shape among the tool's last 100 answers",
            share.clone(),
        );
        let new_shapes = Family::<Labels, Counter>::default();
        registry.register(
            "toolspan_tool_answer_new_shapes",
            "Answers with a shape the tool had not answered with before, after its first 10 answers",
            new_shapes.clone(),
        );
        AnswerShapes {
            answers,
            share,
            new_shapes,
            tools: HashMap::new(),
        }
    }

    /// One answer of `tool` (its capped label) with shape `shape`; true when the shape label
    /// was past the tool's cap (recorded as `__other__`).
    pub fn answer(&mut self, tool: &str, shape: &str) -> bool {
        let new_shapes = vec![("tool", tool.to_string())];
        if !self.tools.contains_key(tool) {
            // At zero from the tool's first answer, so that increase() sees the first event.
            drop(self.new_shapes.get_or_create(&new_shapes));
        }
        let t = self.tools.entry(tool.to_string()).or_default();
        if !t.remembered.contains(shape) && t.remembered.len() < MAX_REMEMBERED {
            t.remembered.insert(shape.to_string());
            if t.answers >= BASELINE_ANSWERS {
                self.new_shapes.get_or_create(&new_shapes).inc();
            }
        }
        t.answers += 1;
        let overflow = if t.labelled.iter().any(|l| l == shape) {
            false
        } else if t.labelled.len() < MAX_SHAPES_PER_TOOL {
            t.labelled.push(shape.to_string());
            false
        } else {
            true
        };
        let label = if overflow { OTHER } else { shape };
        self.answers.get_or_create(&labels(tool, label)).inc();
        t.recent.push_back(label.to_string());
        *t.counts.entry(label.to_string()).or_default() += 1;
        if t.recent.len() > SHARE_WINDOW {
            if let Some(old) = t.recent.pop_front() {
                if let Some(c) = t.counts.get_mut(&old) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let n = t.recent.len().max(1) as f64;
        for (l, c) in &t.counts {
            self.share
                .get_or_create(&labels(tool, l))
                .set(*c as f64 / n);
        }
        overflow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(reg: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, reg).expect("encode");
        out
    }

    #[test]
    fn a_shape_after_the_baseline_is_an_event_and_shares_follow_the_recent_answers() {
        let mut reg = Registry::default();
        let mut s = AnswerShapes::register(&mut reg);
        // Two shapes within the first ten answers: the baseline, no event.
        for k in 0..10 {
            s.answer("search_docs", if k % 2 == 0 { "aaaa" } else { "bbbb" });
        }
        let text = exposition(&reg);
        assert!(
            text.contains("toolspan_tool_answer_new_shapes_total{tool=\"search_docs\"} 0"),
            "{text}"
        );
        // A third shape after it: one event, however often it comes.
        for _ in 0..100 {
            s.answer("search_docs", "cccc");
        }
        let text = exposition(&reg);
        assert!(
            text.contains("toolspan_tool_answer_new_shapes_total{tool=\"search_docs\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "toolspan_tool_answer_shapes_total{tool=\"search_docs\",shape=\"cccc\"} 100"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "toolspan_tool_answer_shape_share{tool=\"search_docs\",shape=\"cccc\"} 1.0"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "toolspan_tool_answer_shape_share{tool=\"search_docs\",shape=\"aaaa\"} 0.0"
            ),
            "{text}"
        );
    }

    #[test]
    fn shape_labels_are_capped_per_tool() {
        let mut reg = Registry::default();
        let mut s = AnswerShapes::register(&mut reg);
        let overflowed: Vec<bool> = (0..MAX_SHAPES_PER_TOOL + 3)
            .map(|k| s.answer("lookup", &format!("{k:016x}")))
            .collect();
        assert_eq!(overflowed.iter().filter(|o| **o).count(), 3);
        let text = exposition(&reg);
        assert!(
            text.contains(
                "toolspan_tool_answer_shapes_total{tool=\"lookup\",shape=\"__other__\"} 3"
            ),
            "{text}"
        );
        let series = text
            .lines()
            .filter(|l| l.starts_with("toolspan_tool_answer_shapes_total"))
            .count();
        assert_eq!(series, MAX_SHAPES_PER_TOOL + 1);
    }
}
