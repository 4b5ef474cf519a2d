//! The fleet's behaviour, measured on generated traffic.

use super::*;

#[test]
fn same_seed_same_traffic() {
    let a =
        Fleet::new(FleetConfig::default()).request(50, 1_764_410_400_000_000_000, 60_000_000_000);
    let b =
        Fleet::new(FleetConfig::default()).request(50, 1_764_410_400_000_000_000, 60_000_000_000);
    assert_eq!(a, b);
    let spans: usize = a
        .resource_spans
        .iter()
        .map(|r| r.scope_spans[0].spans.len())
        .sum();
    assert!(
        spans > 50 * 8,
        "a run has an agent, model calls, calls, attempts and stages: {spans}"
    );
}

use opentelemetry_proto::tonic::common::v1::any_value::Value;

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(v) => Some(v.as_str()),
        _ => None,
    }
}

fn failed(span: &Span) -> bool {
    span.status.as_ref().is_some_and(|s| s.code == 2)
}

/// A result carrying stack frames (Python, Java or Node).
fn stack_trace(result: &str) -> bool {
    result.contains("Traceback (most recent call last)")
        || result.contains("\n\tat ")
        || result.contains("\n    at ")
}

/// `n` agent runs with payloads and three times the usual failure rates.
fn runs(n: usize) -> Vec<(usize, Vec<Span>)> {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 7,
        payloads: true,
        failure_scale: 3.0,
    });
    (0..n)
        .map(|k| fleet.trace(1_764_410_400_000_000_000 + k as u64 * 1_000_000_000))
        .collect()
}

/// What one version's calls of one tool did, from the spans alone, as `toolspan compare`
/// measures it.
#[derive(Debug, Default)]
struct Figures {
    calls: usize,
    failed: usize,
    /// Failed calls whose result is a stack trace.
    leaked: usize,
    /// Failed calls without `toolspan.error.code`.
    unmapped: usize,
    /// Failed calls with no code on the span nor in an envelope result.
    no_code: usize,
    /// Spans of the tool (any stage) with a `toolspan.error.*` attribute.
    envelope_spans: usize,
    /// Runs of consecutive failed calls of the tool in a trace, and those a later call
    /// of the tool in the same trace ended with a success.
    streaks: usize,
    recovered: usize,
    /// Failed calls in the recovered streaks plus the successful call, summed.
    calls_to_recovery: usize,
    /// Calls of the tool right after a failed one, and those with identical arguments.
    after_failure: usize,
    identical: usize,
    /// Calls of the tool not right after a failed one, and those that failed.
    fresh: usize,
    fresh_failed: usize,
    /// Per stage: stage spans, failed stage spans.
    stages: [(usize, usize); 4],
}

impl Figures {
    fn of(runs: &[(usize, Vec<Span>)], res: usize, tool: &str) -> Figures {
        let mut x = Figures::default();
        for (_, spans) in runs.iter().filter(|(r, _)| *r == res) {
            let of_tool: Vec<&Span> = spans
                .iter()
                .filter(|s| attr(s, "gen_ai.tool.name") == Some(tool))
                .collect();
            let mut calls: Vec<&Span> = of_tool
                .iter()
                .copied()
                .filter(|s| attr(s, "gen_ai.operation.name") == Some("execute_tool"))
                .collect();
            calls.sort_by_key(|s| s.start_time_unix_nano);
            let mut prev: Option<&Span> = None;
            let mut streak = 0;
            for c in calls {
                x.calls += 1;
                if let Some(p) = prev.filter(|p| failed(p)) {
                    x.after_failure += 1;
                    let args = |s| attr(s, "gen_ai.tool.call.arguments").expect("arguments");
                    if args(p) == args(c) {
                        x.identical += 1;
                    }
                } else {
                    x.fresh += 1;
                    x.fresh_failed += usize::from(failed(c));
                }
                if failed(c) {
                    x.failed += 1;
                    let result = attr(c, "gen_ai.tool.call.result").expect("result");
                    if stack_trace(result) {
                        x.leaked += 1;
                    }
                    if attr(c, "toolspan.error.code").is_none() {
                        x.unmapped += 1;
                        if !result.starts_with("{\"error\":{\"code\":\"") {
                            x.no_code += 1;
                        }
                    }
                    if streak == 0 {
                        x.streaks += 1;
                    }
                    streak += 1;
                } else if streak > 0 {
                    x.recovered += 1;
                    x.calls_to_recovery += streak + 1;
                    streak = 0;
                }
                prev = Some(c);
            }
            for s in of_tool {
                if s.attributes
                    .iter()
                    .any(|kv| kv.key.starts_with("toolspan.error."))
                {
                    x.envelope_spans += 1;
                }
                if let Some(k) =
                    attr(s, "toolspan.stage").and_then(|st| STAGES.iter().position(|x| *x == st))
                {
                    x.stages[k].0 += 1;
                    x.stages[k].1 += usize::from(failed(s));
                }
            }
        }
        x
    }

    fn share(n: usize, of: usize) -> f64 {
        assert!(of > 50, "too few to measure: {n} of {of}");
        n as f64 / of as f64
    }

    fn failure_rate(&self) -> f64 {
        Self::share(self.failed, self.calls)
    }
    fn leaked_share(&self) -> f64 {
        Self::share(self.leaked, self.failed)
    }
    fn unmapped_share(&self) -> f64 {
        Self::share(self.unmapped, self.failed)
    }
    fn no_code_share(&self) -> f64 {
        Self::share(self.no_code, self.failed)
    }
    fn recovery_rate(&self) -> f64 {
        Self::share(self.recovered, self.streaks)
    }
    fn mean_calls_to_recovery(&self) -> f64 {
        self.calls_to_recovery as f64 / self.recovered.max(1) as f64
    }
    fn hammering(&self) -> f64 {
        Self::share(self.identical, self.after_failure)
    }
    fn fresh_failure_rate(&self) -> f64 {
        Self::share(self.fresh_failed, self.fresh)
    }
}

/// Support-bot 1.4.2's update_ticket leaks stack traces and maps no error,
/// 1.5.0's answers with envelopes; after an envelope the model corrects its arguments and
/// recovers, after a stack trace it hammers the tool with the same arguments and mostly
/// fails again.
#[test]
fn update_ticket_recovers_after_envelopes_and_hammers_after_stack_traces() {
    let runs = runs(10_000);
    let old = Figures::of(&runs, 0, "update_ticket");
    let new = Figures::of(&runs, 1, "update_ticket");
    let report = |v: &str, x: &Figures| {
        eprintln!(
            "update_ticket {v}: {} calls, failure rate {:.3} (not after a failure {:.3}), \
             leaked {:.3}, unmapped {:.3} (no code at all {:.3}), recovery {:.3} of {} \
             streaks ({:.2} calls to recovery), identical arguments after a failure \
             {:.3} of {}",
            x.calls,
            x.failure_rate(),
            x.fresh_failure_rate(),
            x.leaked_share(),
            x.unmapped_share(),
            x.no_code_share(),
            x.recovery_rate(),
            x.streaks,
            x.mean_calls_to_recovery(),
            x.hammering(),
            x.after_failure
        )
    };
    report("1.4.2", &old);
    report("1.5.0", &new);

    assert_eq!(
        old.leaked_share(),
        1.0,
        "1.4.2 answers every failure with a trace"
    );
    assert_eq!(
        new.leaked_share(),
        0.0,
        "1.5.0 answers every failure with an envelope"
    );
    assert_eq!(old.unmapped_share(), 1.0, "1.4.2 maps no failure");
    assert_eq!(
        old.envelope_spans, 0,
        "no 1.4.2 span carries toolspan.error.*"
    );
    // 1.5.0's "unexpected error" has no code on its spans, but its envelope says
    // internal_error (the ingest fills the column from it).
    assert!(new.unmapped_share() < 0.1, "{new:?}");
    assert_eq!(new.no_code_share(), 0.0);

    // The same tool otherwise: calls that do not follow a failure fail alike.
    assert!((old.fresh_failure_rate() - new.fresh_failure_rate()).abs() < 0.04);
    assert!(
        new.recovery_rate() > old.recovery_rate() + 0.2,
        "envelopes recover clearly more often: {:.3} vs {:.3}",
        new.recovery_rate(),
        old.recovery_rate()
    );
    assert!(new.mean_calls_to_recovery() < old.mean_calls_to_recovery());
    assert!(
        old.hammering() > 0.5 && new.hammering() < 0.2,
        "stack traces make the model resend the same arguments: {:.3} vs {:.3}",
        old.hammering(),
        new.hammering()
    );
}

/// Only update_ticket differs between support-bot's versions: search_docs fails alike.
#[test]
fn the_support_bot_versions_differ_in_update_ticket_only() {
    let runs = runs(10_000);
    let old = Figures::of(&runs, 0, "search_docs");
    let new = Figures::of(&runs, 1, "search_docs");
    eprintln!(
        "search_docs: failure rate 1.4.2 {:.3} of {} calls, 1.5.0 {:.3} of {} calls; \
         stages (spans, failed) {:?} vs {:?}",
        old.failure_rate(),
        old.calls,
        new.failure_rate(),
        new.calls,
        old.stages,
        new.stages
    );
    assert!((old.failure_rate() - new.failure_rate()).abs() < 0.04);
    for (stage, (a, b)) in STAGES.iter().zip(old.stages.iter().zip(&new.stages)) {
        let rate = |(spans, failed): &(usize, usize)| Figures::share(*failed, *spans);
        assert!((rate(a) - rate(b)).abs() < 0.04, "{stage}: {a:?} vs {b:?}");
    }
    assert_eq!(old.leaked_share(), 0.0);
    assert_eq!(new.leaked_share(), 0.0);
    assert!((old.unmapped_share() - new.unmapped_share()).abs() < 0.04);
}

/// Follow-ups are new logical calls under the root, runs stay bounded, and without
/// payloads no arguments or results are emitted.
#[test]
fn follow_ups_are_new_calls_and_runs_stay_bounded() {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 5,
        payloads: false,
        failure_scale: 3.0,
    });
    let mut longest = 0;
    for k in 0..2000u64 {
        let (_, spans) = fleet.trace(1_764_410_400_000_000_000 + k * 1_000_000_000);
        let root = spans.last().expect("the root comes last");
        assert_eq!(attr(root, "gen_ai.operation.name"), Some("invoke_agent"));
        let calls: Vec<&Span> = spans
            .iter()
            .filter(|s| attr(s, "gen_ai.operation.name") == Some("execute_tool"))
            .collect();
        let mut ids: Vec<&str> = calls
            .iter()
            .map(|c| attr(c, "gen_ai.tool.call.id").expect("call id"))
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), calls.len(), "every call has its own id");
        for c in &calls {
            assert_eq!(c.parent_span_id, root.span_id);
            assert!(c.attributes.iter().any(|kv| kv.key == "toolspan.attempts"));
        }
        assert!(spans.iter().all(|s| s.attributes.iter().all(|kv| {
            kv.key != "gen_ai.tool.call.arguments" && kv.key != "gen_ai.tool.call.result"
        })));
        let llm = spans
            .iter()
            .filter(|s| attr(s, "gen_ai.operation.name") == Some("chat"))
            .count();
        assert_eq!(
            llm,
            calls.len() + 1,
            "a model call before every call, and a last one"
        );
        longest = longest.max(calls.len());
    }
    let bound = 3 * (1 + MAX_FOLLOW_UPS as usize);
    assert!(longest > 3 && longest <= bound, "{longest} calls");
}

#[test]
fn the_docs_service_renames_url_to_link_and_search_docs_fails_to_parse_after() {
    let base = 1_764_410_400_000_000_000u64;
    let at = base + 100 * 1_000_000_000;
    let mut fleet = Fleet::new(FleetConfig::default());
    fleet.rename_docs_field_at(at);
    let spans: Vec<Span> = (0..200)
        .flat_map(|k| fleet.trace(base + k * 1_000_000_000).1)
        .collect();
    let of_docs = |stage: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| {
                attr(s, "gen_ai.tool.name") == Some("search_docs")
                    && attr(s, "toolspan.stage") == Some(stage)
            })
            .collect()
    };
    let (mut url, mut link) = (0, 0);
    for send in of_docs("send") {
        let Some(answer) = attr(send, "gen_ai.tool.call.result") else {
            assert!(failed(send), "a send stage that got an answer records it");
            continue;
        };
        let hits = serde_json::from_str::<serde_json::Value>(answer).expect("JSON")["hits"]
            .as_array()
            .expect("hits")
            .clone();
        // An attempt that started before the rename still got the old answer.
        let t = send.start_time_unix_nano;
        if (at..at + 10_000_000_000).contains(&t) {
            continue;
        }
        let renamed = t >= at;
        let field = if renamed { "link" } else { "url" };
        assert!(
            hits.iter()
                .all(|h| h["title"].is_string() && h[field].is_string()),
            "{answer}"
        );
        if renamed {
            link += 1;
        } else {
            url += 1;
        }
    }
    assert!(
        url > 20 && link > 20,
        "answers before and after: {url} {link}"
    );
    let mut bad = 0;
    for parse in of_docs("parse") {
        let code = attr(parse, "toolspan.error.code");
        let t = parse.start_time_unix_nano;
        if (at..at + 10_000_000_000).contains(&t) {
            continue;
        }
        if t >= at {
            assert_eq!(
                code,
                Some("bad_answer"),
                "every parse after the rename fails"
            );
            assert_eq!(
                parse.status.as_ref().map(|s| s.message.as_str()),
                Some("the docs service answered without 'url' in a hit; try again later")
            );
            assert_eq!(attr(parse, "toolspan.error.class"), Some("internal"));
            bad += 1;
        } else {
            assert_ne!(code, Some("bad_answer"));
        }
    }
    assert!(bad > 20);
    // Before the rename, the traffic is what it is without one.
    let mut plain = Fleet::new(FleetConfig::default());
    let before: Vec<Span> = (0..50)
        .flat_map(|k| plain.trace(base + k * 1_000_000_000).1)
        .collect();
    assert_eq!(before[..], spans[..before.len()]);
}
