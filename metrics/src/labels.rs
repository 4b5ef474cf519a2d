//! The per-label caps of METRICS.md: tools and services keep their first N distinct values,
//! versions the N most recently seen per service.

use std::collections::{HashMap, HashSet};

use crate::series::OTHER;

/// Tool names longer than this become [`OTHER`].
pub const MAX_TOOL_BYTES: usize = 128;

/// What resolving one span's labels changed besides the values themselves.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The tool label.
    pub tool: String,
    /// The service label.
    pub service: String,
    /// The service_version label.
    pub version: String,
    /// The tool was replaced by [`OTHER`].
    pub tool_overflow: bool,
    /// The service was replaced by [`OTHER`].
    pub service_overflow: bool,
    /// A version of `service` that must lose its series: the least recently seen one, pushed
    /// out by a version past the per-service limit.
    pub evicted_version: Option<String>,
}

/// The caps' memory.
pub struct LabelCaps {
    max_tools: usize,
    max_services: usize,
    max_versions: usize,
    tools: HashSet<String>,
    services: HashSet<String>,
    /// Per (capped) service: its versions with the tick they were last seen at.
    versions: HashMap<String, Vec<(String, u64)>>,
    tick: u64,
}

impl LabelCaps {
    /// Caps of the given sizes.
    pub fn new(max_tools: usize, max_services: usize, max_versions: usize) -> LabelCaps {
        LabelCaps {
            max_tools,
            max_services,
            max_versions,
            tools: HashSet::new(),
            services: HashSet::new(),
            versions: HashMap::new(),
            tick: 0,
        }
    }

    /// The labels of a span of `tool` from `service` at `version` (`None`: absent).
    pub fn resolve(&mut self, tool: &str, service: &str, version: Option<&str>) -> Resolved {
        let (tool, tool_overflow) = first_n(&mut self.tools, self.max_tools, tool, MAX_TOOL_BYTES);
        let (service, service_overflow) =
            first_n(&mut self.services, self.max_services, service, usize::MAX);
        let version = version.filter(|v| !v.is_empty()).unwrap_or("unknown");
        let evicted_version = self.see_version(&service, version);
        Resolved {
            tool,
            service,
            version: version.to_string(),
            tool_overflow,
            service_overflow,
            evicted_version,
        }
    }

    /// Marks `version` of `service` as seen now; returns the version it pushed out, if any.
    fn see_version(&mut self, service: &str, version: &str) -> Option<String> {
        self.tick += 1;
        let tick = self.tick;
        let seen = self.versions.entry(service.to_string()).or_default();
        if let Some(slot) = seen.iter_mut().find(|(v, _)| v == version) {
            slot.1 = tick;
            return None;
        }
        let mut evicted = None;
        if seen.len() >= self.max_versions.max(1) {
            // Least recently seen: the smallest tick. `seen` is not empty here.
            if let Some(i) = seen
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(i, _)| i)
            {
                evicted = Some(seen.swap_remove(i).0);
            }
        }
        seen.push((version.to_string(), tick));
        evicted
    }
}

/// `value` when it is known or there is room for it (and it is short enough), else [`OTHER`];
/// the flag says it was replaced.
fn first_n(
    known: &mut HashSet<String>,
    max: usize,
    value: &str,
    max_bytes: usize,
) -> (String, bool) {
    if value.len() > max_bytes {
        return (OTHER.to_string(), true);
    }
    if known.contains(value) {
        return (value.to_string(), false);
    }
    if known.len() < max {
        known.insert(value.to_string());
        return (value.to_string(), false);
    }
    (OTHER.to_string(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_past_the_cap_and_long_names_become_other() {
        let mut caps = LabelCaps::new(2, 50, 5);
        assert_eq!(caps.resolve("a", "s", None).tool, "a");
        assert_eq!(caps.resolve("b", "s", None).tool, "b");
        let r = caps.resolve("c", "s", None);
        assert_eq!((r.tool.as_str(), r.tool_overflow), (OTHER, true));
        assert_eq!(
            caps.resolve("a", "s", None).tool,
            "a",
            "a known tool keeps its name"
        );
        let long = "x".repeat(MAX_TOOL_BYTES + 1);
        let mut roomy = LabelCaps::new(100, 50, 5);
        assert!(roomy.resolve(&long, "s", None).tool_overflow);
        assert!(
            !roomy
                .resolve(&"y".repeat(MAX_TOOL_BYTES), "s", None)
                .tool_overflow
        );
    }

    #[test]
    fn the_least_recently_seen_version_is_evicted() {
        let mut caps = LabelCaps::new(10, 10, 3);
        for v in ["1", "2", "3"] {
            assert_eq!(caps.resolve("t", "svc", Some(v)).evicted_version, None);
        }
        caps.resolve("t", "svc", Some("1")); // 2 is now the least recently seen
        assert_eq!(
            caps.resolve("t", "svc", Some("4"))
                .evicted_version
                .as_deref(),
            Some("2")
        );
        assert_eq!(
            caps.resolve("t", "other-svc", Some("9")).evicted_version,
            None,
            "per service"
        );
        assert_eq!(caps.resolve("t", "svc", None).version, "unknown");
    }
}
