//! The fleet: services, agents, tools with failure profiles, and the trace of one agent run.
//!
//! A run is a root `invoke_agent` span, one to three steps of (model call, tool call) and a
//! final model call. A tool call that fails after its own retries answers the model with an
//! error envelope or, for tools that leak, a raw stack trace, and what the model saw decides
//! its next turn: usually it calls the same tool again (another model call, then a new
//! logical call). After an envelope it mostly corrects its arguments and the call succeeds;
//! after a stack trace it often resends the identical arguments (hammering) and mostly meets
//! the same failure again, up to `MAX_FOLLOW_UPS` calls in a row.
//!
//! support-bot runs two versions of `update_ticket`: in 1.4.2, which predates error
//! envelopes, every failure answers the model with a stack trace and no span of the call
//! carries `toolspan.error.*` (an "unmapped" failure); in 1.5.0 every failure answers with an
//! envelope. Nothing else differs between the versions (failure rates, latencies, the other
//! tools), so comparing the versions' `update_ticket` calls on demo data
//! (`toolspan compare`) shows what the envelope changes, and comparing another tool shows no
//! difference.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::otlp::{i, s};
use crate::PLANTED_SECRETS;

mod failures;
mod profiles;

use failures::{
    bad_answer, docs_answer, envelope_attrs, failure, invalid_arguments, Failure, LEAKS,
};
pub use profiles::TOOLS;
use profiles::{answers, resource_of, Answers, Service, STAGES, TOOL_PROFILES};

/// How the fleet behaves.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Seed: the same seed gives the same traffic.
    pub seed: u64,
    /// Capture tool arguments and results (with planted secrets and leaked stack traces).
    pub payloads: bool,
    /// Multiplies every failure probability (1.0 = the realistic default rates).
    pub failure_scale: f64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            seed: 42,
            payloads: true,
            failure_scale: 1.0,
        }
    }
}

/// The chance that the model calls the tool again in its next turn after an envelope
/// (otherwise it moves on or gives up): the envelope says what to change.
const FOLLOW_UP_AFTER_ENVELOPE: f64 = 0.95;
/// The same after a stack trace, which tells the model little it can act on.
const FOLLOW_UP_AFTER_TRACE: f64 = 0.6;
/// At most this many follow-up calls after one failure, so that a run stays bounded.
const MAX_FOLLOW_UPS: u32 = 3;
/// After an envelope: the chance that the model resends the identical arguments.
const RESEND_AFTER_ENVELOPE: f64 = 0.1;
/// After an envelope and corrected arguments: the chance that the correction removes every
/// failure (otherwise the call meets the tool's usual failure rates).
const FIXED_AFTER_ENVELOPE: f64 = 0.95;
/// After a stack trace: the chance that the model resends the identical arguments (hammering).
const RESEND_AFTER_TRACE: f64 = 0.7;
/// After a stack trace: the chance that the follow-up meets the same failure again (otherwise
/// it meets the tool's usual failure rates).
const REPEAT_AFTER_TRACE: f64 = 0.6;

/// What the model takes from a failed call into its next turn.
struct Seen {
    /// The arguments it sent.
    arguments: String,
    /// The tool answered with a stack trace rather than an envelope.
    leaked: bool,
    /// The stage that failed and the failure's variant (the `r` of [`failure`]): the same
    /// request meets the same failure.
    stage: usize,
    variant: f64,
}

/// What a call's stages do instead of drawing their failures.
#[derive(Debug, Clone, Copy)]
enum Force {
    /// Draw each stage's failure at the tool's rates.
    Draw,
    /// Every stage succeeds.
    Succeed,
    /// Every attempt fails at `stage` with the failure of `variant`.
    Repeat { stage: usize, variant: f64 },
}

/// A logical call as its attempts see it.
struct CallOf<'a> {
    tool: usize,
    id: &'a str,
    span: &'a [u8],
    mapped: bool,
    force: Force,
}

/// A failed attempt: the failure, its reference, its stage and its variant.
struct Failed {
    f: Failure,
    reference: String,
    stage: usize,
    variant: f64,
}

/// The synthetic fleet: five service versions (support-bot 1.4.2 and 1.5.0,
/// research-assistant 2.0.1, ops-copilot 0.9.3 and 0.9.4) whose agents call models and tools.
///
/// After a failed tool call the model usually calls the tool again in its next turn; how well
/// that goes depends on what the failure showed it (an envelope or a stack trace). support-bot
/// 1.4.2's `update_ticket` answers every failure with a stack trace and leaves it unmapped
/// (no `toolspan.error.*`), 1.5.0's answers with an envelope; nothing else differs between
/// the two versions. See the module documentation.
pub struct Fleet {
    cfg: FleetConfig,
    rng: StdRng,
    /// From this time on (ns since the epoch), the docs service answers `search_docs` with
    /// `link` where it said `url`.
    renamed_at: Option<u64>,
}

struct Ctx {
    trace_id: Vec<u8>,
    spans: Vec<Span>,
}

impl Fleet {
    /// A fleet with the given configuration.
    pub fn new(cfg: FleetConfig) -> Fleet {
        let rng = StdRng::seed_from_u64(cfg.seed);
        Fleet {
            cfg,
            rng,
            renamed_at: None,
        }
    }

    /// From `at_ns` on (attempts starting then or later), the docs service behind
    /// `search_docs` renames the field `url` of its answer's hits to `link` (a new version of
    /// the service): `search_docs`'s send stage records the renamed answer and its parse stage,
    /// which still reads `url`, fails (`PARSE`, code `bad_answer`). Traffic before `at_ns` is
    /// the same as without it.
    pub fn rename_docs_field_at(&mut self, at_ns: u64) {
        self.renamed_at = Some(at_ns);
    }

    fn id8(&mut self) -> Vec<u8> {
        let v: u64 = self.rng.random::<u64>() | 1;
        v.to_be_bytes().to_vec()
    }

    fn ms(&mut self, mean: f64) -> u64 {
        // A skewed latency: mean times a factor in [0.3, 3).
        let f = 0.3 + self.rng.random::<f64>().powi(3) * 2.7;
        (mean * f * 1e6) as u64
    }

    /// A request holding `traces` agent runs starting between `start_ns` and
    /// `start_ns + spread_ns`, grouped by service as an SDK exporter groups them.
    pub fn request(
        &mut self,
        traces: usize,
        start_ns: u64,
        spread_ns: u64,
    ) -> ExportTraceServiceRequest {
        let mut by_resource: Vec<Vec<Span>> = vec![Vec::new(); 5];
        for _ in 0..traces {
            let offset = if spread_ns == 0 {
                0
            } else {
                self.rng.random_range(0..spread_ns)
            };
            let (res, spans) = self.trace(start_ns + offset);
            by_resource[res].extend(spans);
        }
        let mut resource_spans = Vec::new();
        for (idx, spans) in by_resource.into_iter().enumerate() {
            if spans.is_empty() {
                continue;
            }
            let (svc, ver) = resource_of(idx);
            resource_spans.push(ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        s("service.name", svc.name),
                        s("service.version", ver),
                        s("deployment.environment.name", "production"),
                        s("telemetry.sdk.language", "python"),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "toolspan.demo".into(),
                        version: "0.1.0".into(),
                        ..Default::default()
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            });
        }
        ExportTraceServiceRequest { resource_spans }
    }

    /// One agent run: returns the resource index and its spans.
    pub fn trace(&mut self, start: u64) -> (usize, Vec<Span>) {
        let res = self.rng.random_range(0..5usize);
        let (svc, version) = resource_of(res);
        let mut trace_id = vec![0u8; 16];
        self.rng.fill(&mut trace_id[..]);
        trace_id[0] |= 1;
        let mut ctx = Ctx {
            trace_id,
            spans: Vec::new(),
        };
        let root_id = self.id8();
        let mut t = start + self.ms(5.0);
        let steps = self.rng.random_range(1..=3);
        let mut unrecovered = 0;
        for _ in 0..steps {
            t = self.llm(&mut ctx, &root_id, svc, t);
            let tool = svc.tools[self.rng.random_range(0..svc.tools.len())];
            let answers = answers(svc, version, tool);
            let (end, mut failed) = self.call(&mut ctx, &root_id, tool, answers, t, None);
            t = end;
            // The model reads the failure and, in its next turn, usually calls the tool again.
            let mut follow_ups = 0;
            while let Some(seen) = failed {
                let follow_up = if seen.leaked {
                    FOLLOW_UP_AFTER_TRACE
                } else {
                    FOLLOW_UP_AFTER_ENVELOPE
                };
                if follow_ups == MAX_FOLLOW_UPS || !self.rng.random_bool(follow_up) {
                    unrecovered += 1;
                    break;
                }
                follow_ups += 1;
                t = self.llm(&mut ctx, &root_id, svc, t);
                let (end, again) = self.call(&mut ctx, &root_id, tool, answers, t, Some(seen));
                t = end;
                failed = again;
            }
        }
        t = self.llm(&mut ctx, &root_id, svc, t);
        let root_failed = unrecovered > 0 && self.rng.random_bool(0.3);
        ctx.spans.push(Span {
            trace_id: ctx.trace_id.clone(),
            span_id: root_id,
            name: format!("invoke_agent {}", svc.agent),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: t + self.ms(2.0),
            attributes: vec![
                s("gen_ai.operation.name", "invoke_agent"),
                s("gen_ai.agent.name", svc.agent),
            ],
            status: Some(if root_failed {
                Status {
                    code: 2,
                    message: "agent gave up after a failed tool call".into(),
                }
            } else {
                Status {
                    code: 1,
                    message: String::new(),
                }
            }),
            ..Default::default()
        });
        (res, ctx.spans)
    }

    fn llm(&mut self, ctx: &mut Ctx, parent: &[u8], svc: &Service, start: u64) -> u64 {
        let end = start + self.ms(900.0);
        let input = self.rng.random_range(300..6000);
        let output = self.rng.random_range(20..800);
        ctx.spans.push(Span {
            trace_id: ctx.trace_id.clone(),
            span_id: self.id8(),
            parent_span_id: parent.to_vec(),
            name: format!("chat {}", svc.model),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", svc.model),
                i("gen_ai.usage.input_tokens", input),
                i("gen_ai.usage.output_tokens", output),
            ],
            status: Some(Status {
                code: 0,
                message: String::new(),
            }),
            ..Default::default()
        });
        end
    }

    fn arguments(&mut self, tool: usize) -> String {
        let r: f64 = self.rng.random();
        match tool {
            0 => {
                let q = ["how to rotate api keys", "refund policy for annual plans", "reset sso for a tenant", "error E1042 on export"];
                format!("{{\"query\":\"{}\",\"limit\":5}}", q[self.rng.random_range(0..q.len())])
            }
            1 if r < 0.3 => format!(
                "{{\"ticket_id\":\"T-{}\",\"status\":\"pending\",\"customer_email\":\"{}\",\"note\":\"customer paid with {}\"}}",
                self.rng.random_range(1000..9999),
                PLANTED_SECRETS[4],
                PLANTED_SECRETS[3]
            ),
            1 => format!("{{\"ticket_id\":\"T-{}\",\"status\":\"pending\"}}", self.rng.random_range(1000..9999)),
            2 if r < 0.4 => format!(
                "{{\"url\":\"https://reports.s3.amazonaws.com/q3.pdf?X-Amz-Credential={}%2F20261129%2Fus-east-1&X-Amz-Signature={}\"}}",
                PLANTED_SECRETS[0], PLANTED_SECRETS[5]
            ),
            2 if r < 0.6 => format!("{{\"url\":\"https://api.partner.example/v1/items\",\"headers\":{{\"Authorization\":\"Bearer {}\"}}}}", PLANTED_SECRETS[2]),
            2 => "{\"url\":\"https://docs.example.com/guide\"}".to_string(),
            _ if r < 0.3 => format!(
                "{{\"sql\":\"SELECT id, status FROM tickets WHERE id = 42\",\"dsn\":\"postgres://app:{}@db.internal:5432/support\"}}",
                PLANTED_SECRETS[1]
            ),
            _ => "{\"sql\":\"SELECT count(*) FROM tickets WHERE status = 'open'\"}".to_string(),
        }
    }

    fn result(&mut self, tool: usize) -> String {
        match tool {
            // What the tool makes of the docs answer: its hits' titles and links.
            0 => "[{\"title\":\"Rotating API keys\",\"url\":\"https://docs.example.com/keys\"},{\"title\":\"Key lifecycle\",\"url\":\"https://docs.example.com/lifecycle\"}]".to_string(),
            1 => "{\"ok\":true,\"ticket\":{\"status\":\"pending\",\"updated\":true}}".to_string(),
            2 => "{\"status\":200,\"content_type\":\"text/html\",\"text\":\"<h1>Guide</h1><p>Step 1 ...</p>\"}".to_string(),
            _ => "{\"columns\":[\"count\"],\"rows\":[[17]]}".to_string(),
        }
    }

    /// Arguments for `tool` other than `previous` (the model corrected its request); the same
    /// only if a few draws all gave them back.
    fn other_arguments(&mut self, tool: usize, previous: &str) -> String {
        let mut args = self.arguments(tool);
        for _ in 0..16 {
            if args != previous {
                break;
            }
            args = self.arguments(tool);
        }
        args
    }

    /// The arguments and the stages' behaviour of the model's next call of `tool` after a
    /// failure showed it `seen`.
    fn follow_up(&mut self, tool: usize, seen: Seen) -> (String, Force) {
        if seen.leaked {
            // A stack trace says nothing the model can act on: it often resends the same
            // request, and mostly meets the same failure.
            let resend = self.rng.random_bool(RESEND_AFTER_TRACE);
            let repeat = self.rng.random_bool(REPEAT_AFTER_TRACE);
            let args = if resend {
                seen.arguments
            } else {
                self.other_arguments(tool, &seen.arguments)
            };
            // Rejected arguments sent again are rejected again.
            let force = if repeat || (resend && seen.stage == 0) {
                Force::Repeat {
                    stage: seen.stage,
                    variant: seen.variant,
                }
            } else {
                Force::Draw
            };
            (args, force)
        } else if self.rng.random_bool(RESEND_AFTER_ENVELOPE) {
            // The same arguments meet the same validation.
            let force = if seen.stage == 0 {
                Force::Repeat {
                    stage: 0,
                    variant: seen.variant,
                }
            } else {
                Force::Draw
            };
            (seen.arguments, force)
        } else {
            // The envelope named what was wrong: the model corrects its arguments.
            let args = self.other_arguments(tool, &seen.arguments);
            let force = if self.rng.random_bool(FIXED_AFTER_ENVELOPE) {
                Force::Succeed
            } else {
                Force::Draw
            };
            (args, force)
        }
    }

    /// One logical tool call with its attempts, the first of a turn (`prev` = None) or a
    /// follow-up of a failed one; returns the end time and, when it failed, what the model
    /// saw.
    fn call(
        &mut self,
        ctx: &mut Ctx,
        parent: &[u8],
        tool: usize,
        answers: Answers,
        start: u64,
        prev: Option<Seen>,
    ) -> (u64, Option<Seen>) {
        let p = &TOOL_PROFILES[tool];
        let previous = prev.as_ref().map(|seen| seen.arguments.clone());
        let rejected_before = prev.as_ref().is_some_and(|seen| seen.stage == 0);
        let (mut arguments, force) = match prev {
            None => (self.arguments(tool), Force::Draw),
            Some(seen) => self.follow_up(tool, seen),
        };
        let call_id = format!("call_{:012x}", self.rng.random::<u64>() & 0xffff_ffff_ffff);
        let call_span = self.id8();
        let call = CallOf {
            tool,
            id: &call_id,
            span: &call_span,
            mapped: answers.mapped,
            force,
        };
        let mut t = start + self.ms(1.0);
        let mut last: Option<Failed> = None;
        let mut attempts = 0;
        for n in 1..=p.max_attempts {
            attempts = n;
            let (end, fail) = self.attempt(ctx, &call, n, t);
            t = end;
            match fail {
                None => {
                    last = None;
                    break;
                }
                Some(failed) => {
                    let f = &failed.f;
                    let retry = f.retryable && n < p.max_attempts;
                    let backoff = f
                        .retry_after_ms
                        .map(|ms| ms as u64 * 1_000_000)
                        .unwrap_or(200_000_000 * u64::from(n));
                    last = Some(failed);
                    if !retry {
                        break;
                    }
                    t += backoff;
                }
            }
        }
        // Arguments resent after a rejection stay as they were sent (they were rejected
        // already); arguments resent after another failure can meet a rejection of their own.
        let resent = rejected_before && previous.as_deref() == Some(arguments.as_str());
        if let Some(failed) = last.as_ref().filter(|l| l.stage == 0 && !resent) {
            // What the validation rejected is what the call sent.
            let ticket = self.rng.random_range(1000..9999);
            if let Some(bad) = invalid_arguments(tool, &failed.f, ticket) {
                arguments = bad;
            }
        }
        let mut attrs = vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", p.name),
            s("gen_ai.tool.call.id", call_id.clone()),
            i("toolspan.attempts", i64::from(attempts)),
        ];
        if self.cfg.payloads {
            attrs.push(s("gen_ai.tool.call.arguments", arguments.clone()));
        }
        let mut seen = None;
        let status = match last {
            None => {
                if self.cfg.payloads {
                    let r = self.result(tool);
                    attrs.push(s("gen_ai.tool.call.result", r));
                }
                Status {
                    code: 1,
                    message: String::new(),
                }
            }
            Some(Failed {
                f,
                reference,
                stage,
                variant,
            }) => {
                if answers.mapped {
                    envelope_attrs(&mut attrs, &f, &reference);
                }
                // Drawn with or without payloads: what the model saw drives its next turn.
                let leaked = self.rng.random_bool(answers.leak);
                if self.cfg.payloads {
                    let result = if leaked {
                        LEAKS[tool % LEAKS.len()].to_string()
                    } else {
                        format!(
                            "{{\"error\":{{\"code\":\"{}\",\"class\":\"{}\",\"retryable\":{},\"reference\":\"{}\"}}}}",
                            if f.code.is_empty() { "internal_error" } else { f.code },
                            f.class,
                            f.retryable,
                            reference
                        )
                    };
                    attrs.push(s("gen_ai.tool.call.result", result));
                }
                seen = Some(Seen {
                    arguments,
                    leaked,
                    stage,
                    variant,
                });
                let msg = if attempts > 1 {
                    format!("{} after {attempts} attempts", f.message)
                } else {
                    f.message.clone()
                };
                Status {
                    code: 2,
                    message: msg,
                }
            }
        };
        let end = t + self.ms(0.5);
        ctx.spans.push(Span {
            trace_id: ctx.trace_id.clone(),
            span_id: call_span,
            parent_span_id: parent.to_vec(),
            name: format!("execute_tool {}", p.name),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: attrs,
            status: Some(status),
            ..Default::default()
        });
        (end, seen)
    }

    /// One attempt with its stages; returns (end time, failure if any).
    fn attempt(
        &mut self,
        ctx: &mut Ctx,
        call: &CallOf,
        n: u32,
        start: u64,
    ) -> (u64, Option<Failed>) {
        let tool = call.tool;
        let p = &TOOL_PROFILES[tool];
        let attempt_span = self.id8();
        let mut t = start;
        let mut failure_out = None;
        // The docs service renamed a field of its answer: the parse stage cannot read it.
        let renamed = tool == 0 && self.renamed_at.is_some_and(|at| start >= at);
        for (k, stage) in STAGES.iter().enumerate() {
            let dur = self.ms(p.latency_ms[k]);
            let drawn = match call.force {
                // The arguments are the same in every attempt: only the first can reject them.
                Force::Draw if k == 0 && n > 1 => false,
                Force::Draw => self
                    .rng
                    .random_bool((p.fail[k] * self.cfg.failure_scale).clamp(0.0, 1.0)),
                Force::Succeed => false,
                Force::Repeat { stage, .. } => k == stage,
            };
            let failed = drawn || (renamed && k == 3);
            let mut attrs = vec![
                s("toolspan.stage", *stage),
                s("gen_ai.tool.name", p.name),
                s("gen_ai.tool.call.id", call.id),
            ];
            if k == 1 {
                attrs.push(s("server.address", p.server));
                attrs.push(i("server.port", 443));
            }
            let mut events = Vec::new();
            let mut status = Status {
                code: 0,
                message: String::new(),
            };
            let mut end = t + dur;
            if failed {
                let variant = match call.force {
                    Force::Repeat { variant, .. } => variant,
                    _ => self.rng.random(),
                };
                let f = if renamed && k == 3 {
                    bad_answer()
                } else {
                    failure(k, tool, variant)
                };
                if let Some(ms) = f.takes_ms {
                    end = t + ms * 1_000_000;
                }
                let reference = format!("err_{:06x}", self.rng.random::<u32>() & 0xff_ffff);
                if call.mapped {
                    envelope_attrs(&mut attrs, &f, &reference);
                }
                if let Some(h) = f.http {
                    attrs.push(i("http.response.status_code", h));
                }
                events.push(Event {
                    time_unix_nano: end,
                    name: "exception".into(),
                    attributes: vec![
                        s("exception.type", f.exception),
                        s("exception.message", f.message.clone()),
                        s(
                            "exception.stacktrace",
                            format!(
                                "{}: {}\n  at {}.{} (handler)",
                                f.exception, f.message, p.name, stage
                            ),
                        ),
                    ],
                    dropped_attributes_count: 0,
                });
                status = Status {
                    code: 2,
                    message: f.message.clone(),
                };
                failure_out = Some(Failed {
                    f,
                    reference,
                    stage: k,
                    variant,
                });
            } else if k == 2 {
                attrs.push(i("http.response.status_code", 200));
            }
            if k == 1 && tool == 0 && !failed && self.cfg.payloads {
                // The send stage records the service's raw answer, as the example tools
                // package's `fetch` does.
                attrs.push(s("gen_ai.tool.call.result", docs_answer(renamed)));
            }
            ctx.spans.push(Span {
                trace_id: ctx.trace_id.clone(),
                span_id: self.id8(),
                parent_span_id: attempt_span.clone(),
                name: format!("{} {}", stage, p.name),
                kind: if k == 1 {
                    SpanKind::Client as i32
                } else {
                    SpanKind::Internal as i32
                },
                start_time_unix_nano: t,
                end_time_unix_nano: end,
                attributes: attrs,
                events,
                status: Some(status),
                ..Default::default()
            });
            t = end;
            if failed {
                break;
            }
        }
        let mut attrs = vec![
            i("toolspan.attempt", i64::from(n)),
            s("gen_ai.tool.name", p.name),
            s("gen_ai.tool.call.id", call.id),
        ];
        let status = match &failure_out {
            Some(Failed { f, reference, .. }) => {
                if call.mapped {
                    envelope_attrs(&mut attrs, f, reference);
                }
                Status {
                    code: 2,
                    message: f.message.clone(),
                }
            }
            None => Status {
                code: 1,
                message: String::new(),
            },
        };
        ctx.spans.push(Span {
            trace_id: ctx.trace_id.clone(),
            span_id: attempt_span,
            parent_span_id: call.span.to_vec(),
            name: format!("attempt {n} {}", p.name),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: t,
            attributes: attrs,
            status: Some(status),
            ..Default::default()
        });
        (t, failure_out)
    }
}

#[cfg(test)]
mod tests;
