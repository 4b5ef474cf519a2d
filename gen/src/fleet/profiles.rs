//! Who is in the fleet: the services and their versions, agents and models, the tools with
//! their failure rates, latencies and retry budgets, and the versions whose tool answers its
//! failures differently (support-bot 1.4.2 and 1.5.0).

pub(super) struct Service {
    pub(super) name: &'static str,
    pub(super) versions: &'static [&'static str],
    pub(super) agent: &'static str,
    pub(super) model: &'static str,
    pub(super) tools: &'static [usize],
}

pub(super) const SERVICES: [Service; 3] = [
    Service {
        name: "support-bot",
        versions: &["1.4.2", "1.5.0"],
        agent: "support-agent",
        model: "gpt-4o",
        tools: &[0, 1, 2],
    },
    Service {
        name: "research-assistant",
        versions: &["2.0.1"],
        agent: "research-agent",
        model: "claude-sonnet-4",
        tools: &[0, 2],
    },
    Service {
        name: "ops-copilot",
        versions: &["0.9.3", "0.9.4"],
        agent: "ops-agent",
        model: "gpt-4o-mini",
        tools: &[3, 0, 1],
    },
];

/// A tool's behaviour: per-attempt failure probability of each stage, attempts allowed,
/// where it runs, and whether its failures leak raw stack traces to the model.
pub(super) struct Tool {
    pub(super) name: &'static str,
    pub(super) fail: [f64; 4],
    pub(super) max_attempts: u32,
    pub(super) server: &'static str,
    pub(super) leak: f64,
    pub(super) latency_ms: [f64; 4],
}

/// The tools the fleet calls.
pub const TOOLS: [&str; 4] = ["search_docs", "update_ticket", "fetch_url", "run_sql"];

pub(super) const TOOL_PROFILES: [Tool; 4] = [
    Tool {
        name: "search_docs",
        fail: [0.005, 0.02, 0.02, 0.06],
        max_attempts: 2,
        server: "search.internal",
        leak: 0.0,
        latency_ms: [2.0, 15.0, 120.0, 4.0],
    },
    Tool {
        name: "update_ticket",
        fail: [0.05, 0.01, 0.04, 0.01],
        max_attempts: 2,
        server: "tickets.internal",
        leak: 0.1,
        latency_ms: [3.0, 10.0, 80.0, 2.0],
    },
    Tool {
        name: "fetch_url",
        fail: [0.01, 0.25, 0.05, 0.03],
        max_attempts: 3,
        server: "egress-proxy.internal",
        leak: 0.05,
        latency_ms: [1.0, 40.0, 300.0, 6.0],
    },
    Tool {
        name: "run_sql",
        fail: [0.02, 0.01, 0.08, 0.02],
        max_attempts: 2,
        server: "db.internal",
        leak: 0.5,
        latency_ms: [2.0, 5.0, 60.0, 3.0],
    },
];

pub(super) const STAGES: [&str; 4] = ["prepare", "send", "execute", "parse"];

/// How a version of a tool answers its failures.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answers {
    /// The chance that a failed call answers the model with a raw stack trace rather than an
    /// envelope.
    pub(super) leak: f64,
    /// The spans carry the envelope (`toolspan.error.*`); false for a tool without an error
    /// mapping, whose failures are unmapped.
    pub(super) mapped: bool,
}

/// Versions whose tool answers differently from its profile: (service, version, tool, answers).
/// The two support-bot versions differ in `update_ticket`'s answers and nothing else.
pub(super) const VERSIONED: [(&str, &str, usize, Answers); 2] = [
    (
        "support-bot",
        "1.4.2",
        1,
        Answers {
            leak: 1.0,
            mapped: false,
        },
    ),
    (
        "support-bot",
        "1.5.0",
        1,
        Answers {
            leak: 0.0,
            mapped: true,
        },
    ),
];

/// How `tool` answers its failures in `version` of `svc`.
pub(super) fn answers(svc: &Service, version: &str, tool: usize) -> Answers {
    VERSIONED
        .iter()
        .find(|(s, v, t, _)| *s == svc.name && *v == version && *t == tool)
        .map(|(_, _, _, a)| *a)
        .unwrap_or(Answers {
            leak: TOOL_PROFILES[tool].leak,
            mapped: true,
        })
}

/// The service and version of resource `idx` (0 and 1: support-bot 1.4.2 and 1.5.0).
pub(super) fn resource_of(idx: usize) -> (&'static Service, &'static str) {
    match idx {
        0 => (&SERVICES[0], SERVICES[0].versions[0]),
        1 => (&SERVICES[0], SERVICES[0].versions[1]),
        2 => (&SERVICES[1], SERVICES[1].versions[0]),
        3 => (&SERVICES[2], SERVICES[2].versions[0]),
        _ => (&SERVICES[2], SERVICES[2].versions[1]),
    }
}
