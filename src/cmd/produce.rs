//! `toolspan produce`: synthetic agent traffic into a Kafka topic, in the OpenTelemetry
//! Collector kafka exporter's format (one trace per message, keyed by trace id, as the exporter
//! writes with `partition_traces_by_id`). For trying `toolspan ingest`, tests and bench/ingest.
//!
//! `--split` and `--part` cut each trace as real exporters do (one span per message in random
//! order, pairs children first, the tool side from a second process), and `--endpoint` sends
//! the same pieces over OTLP/HTTP instead, one request at a time.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use prost::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use toolspan_gen::split::{pieces, Part, Split};
use toolspan_gen::{Fleet, FleetConfig};
use toolspan_schema::Code;

use crate::fail::Failure;

/// Arguments of `toolspan produce`.
#[derive(Args)]
pub struct ProduceArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "TOOLSPAN_KAFKA_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// Topic to write (created with --partitions when absent).
    #[arg(long, default_value = "otlp_spans")]
    pub topic: String,
    /// Partitions of the topic when it is created.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Produce agent runs until at least this many spans were written.
    #[arg(long, default_value_t = 100_000)]
    pub spans: u64,
    /// Message encoding: otlp_proto or otlp_json.
    #[arg(long, default_value = "otlp_proto", value_parser = ["otlp_proto", "otlp_json"])]
    pub format: String,
    /// Share of messages replaced by undecodable garbage (0–1), to exercise dead letters.
    #[arg(long, default_value_t = 0.0)]
    pub garbage_share: f64,
    /// Multiplies the fleet's failure probabilities.
    #[arg(long, default_value_t = 1.0)]
    pub failure_scale: f64,
    /// Start times this many hours before now (spread over one hour).
    #[arg(long, default_value_t = 0.0)]
    pub hours_ago: f64,
    /// The start of the time range instead of now (Unix milliseconds), so that two runs (the
    /// agent and the tool side of `--part`) generate the same timestamps.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=253_402_300_799_999))]
    pub start_unix_ms: Option<u64>,
    /// Fleet seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Capture payloads (arguments and results) as the demo does.
    #[arg(long, default_value_t = false)]
    pub payloads: bool,
    /// Write the produced span ids (hex, one per line) and garbage message count here.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// A librdkafka producer setting (repeatable), e.g. `-X linger.ms=20`.
    #[arg(short = 'X', long = "kafka-option", value_name = "KEY=VALUE")]
    pub client_options: Vec<String>,
    /// How each trace is cut into messages (or requests): `whole` (one trace each),
    /// `span-random` (one span each, in random order within the trace) or
    /// `pairs-children-first` (two spans each, children before parents, as exporters send).
    #[arg(long, default_value = "whole", value_parser = ["whole", "span-random", "pairs-children-first"])]
    pub split: String,
    /// Which spans of each trace: `all`; `agent` (all but each call's execute and parse
    /// stages) or `tool` (only those, as a tool service exports its own). Run `agent`, then
    /// `tool` with the same seed, to send traces from two processes.
    #[arg(long, default_value = "all", value_parser = ["all", "agent", "tool"])]
    pub part: String,
    /// Send the pieces over OTLP/HTTP (protobuf) to this URL, e.g.
    /// http://127.0.0.1:4318/v1/traces, one request at a time, instead of to Kafka.
    #[arg(long)]
    pub endpoint: Option<String>,
}

/// Where the pieces go.
enum Out {
    Kafka(BaseProducer),
    Http(reqwest::Client, String),
}

pub async fn run(args: ProduceArgs) -> Result<(), Failure> {
    if !(0.0..=1.0).contains(&args.garbage_share) {
        return Err(Failure::new(
            Code::InvalidArgument,
            "--garbage-share must be between 0 and 1",
            "",
        ));
    }
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &args.brokers);
    cfg.set("linger.ms", "20");
    cfg.set("queue.buffering.max.messages", "200000");
    cfg.set("compression.type", "lz4");
    for kv in &args.client_options {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(Failure::new(
                Code::InvalidArgument,
                format!("-X expects KEY=VALUE, got {kv:?}"),
                "",
            ));
        };
        cfg.set(k.trim(), v);
    }
    let split = Split::parse(&args.split).unwrap_or(Split::Whole);
    let part = Part::parse(&args.part).unwrap_or(Part::All);
    let out = match &args.endpoint {
        Some(url) => {
            if args.garbage_share > 0.0 {
                return Err(Failure::new(
                    Code::InvalidArgument,
                    "--garbage-share is for Kafka; leave it out with --endpoint",
                    "",
                ));
            }
            Out::Http(reqwest::Client::new(), url.clone())
        }
        None => {
            create_topic(&cfg, &args.topic, args.partitions).await?;
            Out::Kafka(cfg.create().map_err(|e| {
                Failure::new(
                    Code::InvalidConfig,
                    format!("cannot create the kafka producer: {e}"),
                    "",
                )
            })?)
        }
    };
    let json = args.format == "otlp_json";
    let mut fleet = Fleet::new(FleetConfig {
        seed: args.seed,
        payloads: args.payloads,
        failure_scale: args.failure_scale,
    });
    let mut rng_state = args.seed | 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let now = args
        .start_unix_ms
        .map_or(now, |ms| ms.saturating_mul(1_000_000));
    let base = now.saturating_sub((args.hours_ago * 3.6e12) as u64);
    let mut manifest = match &args.manifest {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| {
                Failure::new(
                    Code::InvalidArgument,
                    format!("cannot create {}: {}", p.display(), e.kind()),
                    e,
                )
            },
        )?)),
        None => None,
    };
    let started = Instant::now();
    let (mut spans, mut messages, mut garbage, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut generated = 0u64;
    let mut next_report = Instant::now() + Duration::from_secs(5);
    while generated < args.spans {
        rng_state = xorshift(rng_state);
        let is_garbage =
            args.garbage_share > 0.0 && (rng_state % 1_000_000) as f64 / 1e6 < args.garbage_share;
        let batch: Vec<(Vec<u8>, String)> = if is_garbage {
            garbage += 1;
            let len = 16 + (rng_state % 200) as usize;
            let mut g: Vec<u8> = (0..len)
                .map(|i| (xorshift(rng_state.wrapping_add(i as u64)) & 0xff) as u8)
                .collect();
            // A valid protobuf tag for field 1 followed by a length past the end: never decodable.
            g[0] = 0x0a;
            g[1] = 0xff;
            g[2] = 0xff;
            g[3] = 0x7f;
            vec![(g, format!("garbage-{messages}"))]
        } else {
            let req = fleet.request(1, base + (rng_state % 3_600_000_000_000), 0);
            let mut trace_hex = String::new();
            for s in req
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
            {
                generated += 1;
                if trace_hex.is_empty() {
                    trace_hex = hex(&s.trace_id);
                }
            }
            pieces(&req, split, part, rng_state)
                .into_iter()
                .map(|piece| {
                    for s in piece
                        .resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .flat_map(|s| &s.spans)
                    {
                        spans += 1;
                        if let Some(m) = manifest.as_mut() {
                            let _ = writeln!(m, "{}", hex(&s.span_id));
                        }
                    }
                    let payload = if json {
                        toolspan_gen::encode_json(&piece)
                    } else {
                        piece.encode_to_vec()
                    };
                    (payload, trace_hex.clone())
                })
                .collect()
        };
        for (payload, key) in batch {
            bytes += payload.len() as u64;
            messages += 1;
            match &out {
                Out::Kafka(producer) => send_kafka(producer, &args.topic, &payload, &key)?,
                Out::Http(client, url) => send_http(client, url, payload, json).await?,
            }
        }
        if Instant::now() >= next_report {
            say!(
                "toolspan produce: {messages} messages, {spans} spans ({:.0} spans/s)",
                spans as f64 / started.elapsed().as_secs_f64()
            );
            next_report += Duration::from_secs(5);
        }
    }
    if let Out::Kafka(producer) = &out {
        producer.flush(Duration::from_secs(120)).map_err(|e| {
            Failure::new(
                Code::StoreUnavailable,
                format!("flushing the producer failed: {e}"),
                "",
            )
        })?;
    }
    if let Some(mut m) = manifest {
        m.flush()
            .map_err(|e| Failure::internal("cannot write the manifest", e))?;
    }
    let secs = started.elapsed().as_secs_f64();
    say!(
        "toolspan produce: done; {messages} messages ({garbage} garbage), {spans} spans, {:.1} MB to {} in {secs:.1} s",
        bytes as f64 / 1e6,
        args.endpoint.as_deref().unwrap_or(&args.topic)
    );
    println!("messages={messages} garbage={garbage} spans={spans} bytes={bytes} seconds={secs:.3}");
    Ok(())
}

fn send_kafka(
    producer: &BaseProducer,
    topic: &str,
    payload: &[u8],
    key: &str,
) -> Result<(), Failure> {
    let mut record = BaseRecord::to(topic).payload(payload).key(key);
    loop {
        match producer.send(record) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => {
                return Err(Failure::new(
                    Code::StoreUnavailable,
                    format!("producing to {topic} failed: {e}"),
                    "",
                ))
            }
        }
    }
    producer.poll(Duration::ZERO);
    Ok(())
}

/// One OTLP/HTTP export, retried (as exporters do) while the receiver says to back off.
async fn send_http(
    client: &reqwest::Client,
    url: &str,
    payload: Vec<u8>,
    json: bool,
) -> Result<(), Failure> {
    let ct = if json {
        "application/json"
    } else {
        "application/x-protobuf"
    };
    for _ in 0..60 {
        let r = client
            .post(url)
            .header("content-type", ct)
            .body(payload.clone())
            .send()
            .await
            .map_err(|e| {
                Failure::new(
                    Code::StoreUnavailable,
                    format!("cannot send to {url}: {}", e.without_url()),
                    "",
                )
            })?;
        match r.status().as_u16() {
            200 => return Ok(()),
            429 | 503 => tokio::time::sleep(Duration::from_millis(500)).await,
            s => {
                return Err(Failure::new(
                    Code::InvalidArgument,
                    format!("{url} answered {s}"),
                    "",
                ))
            }
        }
    }
    Err(Failure::new(
        Code::StoreUnavailable,
        format!("{url} kept asking to back off"),
        "",
    ))
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn create_topic(cfg: &ClientConfig, topic: &str, partitions: i32) -> Result<(), Failure> {
    let admin: AdminClient<DefaultClientContext> = cfg.create().map_err(|e| {
        Failure::new(
            Code::InvalidConfig,
            format!("cannot create the kafka admin client: {e}"),
            "",
        )
    })?;
    let new = NewTopic::new(topic, partitions.max(1), TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics([&new], &opts).await.map_err(|e| {
        Failure::new(
            Code::StoreUnavailable,
            format!("cannot reach the brokers to create {topic}: {e}"),
            "",
        )
    })?;
    for r in results {
        match r {
            Ok(_) => {
                say!("toolspan produce: created topic {topic} with {partitions} partitions")
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => {
                return Err(Failure::new(
                    Code::StoreUnavailable,
                    format!("cannot create topic {t}: {e}"),
                    "",
                ))
            }
        }
    }
    Ok(())
}
