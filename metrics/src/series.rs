//! A metric family that holds at most `max` series (METRICS.md, "the cardinality cap").
//!
//! prometheus-client's [`Family`] keeps its series in a map it does not let us list, so the
//! label sets are mirrored here: that is what the cap counts and what version eviction
//! searches.

use std::collections::HashSet;

use prometheus_client::metrics::family::{Family, MetricConstructor};

/// A label set in a fixed per-family order (the order is part of the series identity).
pub type Labels = Vec<(&'static str, String)>;

/// The value a capped label takes once its cap is reached.
pub const OTHER: &str = "__other__";

/// Labels the series cap folds to [`OTHER`]; enum labels (stage, error_type, outcome) stay.
const FOLDED: [&str; 3] = ["tool", "service", "service_version"];

/// How a label set was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The series existed.
    Existing,
    /// A new series with the given labels.
    New,
    /// The family was full: the series was recorded with the capped labels folded.
    Folded,
}

/// A family plus the label sets it holds.
pub struct Capped<M, C> {
    family: Family<Labels, M, C>,
    series: HashSet<Labels>,
    max: usize,
}

impl<M, C: MetricConstructor<M>> Capped<M, C> {
    /// Wraps `family` (a clone of the one registered for encoding).
    pub fn new(family: Family<Labels, M, C>, max: usize) -> Self {
        Capped {
            family,
            series: HashSet::new(),
            max,
        }
    }

    /// Runs `f` on the series of `labels`, creating it; past the cap a new label set is folded.
    pub fn with(&mut self, labels: Labels, f: impl FnOnce(&M)) -> Admission {
        let (labels, admission) = if self.series.contains(&labels) {
            (labels, Admission::Existing)
        } else if self.series.len() < self.max {
            self.series.insert(labels.clone());
            (labels, Admission::New)
        } else {
            let folded = fold(labels);
            // The folded series may itself be new; it is admitted past the cap, since its
            // count is bounded by the enum labels alone.
            self.series.insert(folded.clone());
            (folded, Admission::Folded)
        };
        f(&self.family.get_or_create(&labels));
        admission
    }

    /// Creates the series of `labels` at its initial value when absent and there is room;
    /// never folds (a zero series past the cap would say nothing).
    pub fn touch(&mut self, labels: Labels) {
        if !self.series.contains(&labels) && self.series.len() < self.max {
            drop(self.family.get_or_create(&labels));
            self.series.insert(labels);
        }
    }

    /// Removes every series whose labels satisfy `pred`; returns how many.
    pub fn remove_where(&mut self, pred: impl Fn(&Labels) -> bool) -> usize {
        let doomed: Vec<Labels> = self.series.iter().filter(|l| pred(l)).cloned().collect();
        for l in &doomed {
            self.series.remove(l);
            self.family.remove(l);
        }
        doomed.len()
    }
}

fn fold(mut labels: Labels) -> Labels {
    for (k, v) in labels.iter_mut() {
        if FOLDED.contains(k) {
            *v = OTHER.to_string();
        }
    }
    labels
}

/// The value of label `key` in `labels`.
pub fn value<'a>(labels: &'a Labels, key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
}
