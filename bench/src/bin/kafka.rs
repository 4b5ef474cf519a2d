//! Helpers of `bench/ingest`:
//! - `kafka ceiling BROKERS TOPIC MESSAGES [-X k=v]...`: a plain rdkafka consumer that reads the
//!   topic from the start and discards what it reads, with the same client settings as
//!   `toolspan ingest`; prints `messages= bytes= wall_s= cpu_s=`.
//! - `kafka freshness BROKERS TOPIC TABLE SECONDS RATE`: while `toolspan ingest` runs, produces
//!   RATE marker traces per second for SECONDS, polls the table for them and prints the
//!   produce-to-queryable latency percentiles `p50_ms= p99_ms= max_ms= markers=`.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord};
use toolspan_gen::{Fleet, FleetConfig};

fn cpu_seconds() -> f64 {
    cpu_time::ProcessTime::now().as_duration().as_secs_f64()
}

fn opts(args: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "-X" && i + 1 < args.len() {
            if let Some((k, v)) = args[i + 1].split_once('=') {
                out.push((k.to_string(), v.to_string()));
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    out
}

fn ceiling(brokers: &str, topic: &str, want: u64, x: &[(String, String)]) {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers)
        .set("group.id", format!("ceiling-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("statistics.interval.ms", "5000");
    for (k, v) in x {
        cfg.set(k, v);
    }
    let consumer: BaseConsumer = cfg.create().expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut started = None;
    let cpu0 = cpu_seconds();
    let deadline = Instant::now() + Duration::from_secs(900);
    while messages < want && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            started.get_or_insert_with(Instant::now);
            messages += 1;
            bytes += m.payload().map(|p| p.len() as u64).unwrap_or(0);
        }
    }
    let wall = started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
    println!(
        "messages={messages} bytes={bytes} wall_s={wall:.3} cpu_s={:.3}",
        cpu_seconds() - cpu0
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn freshness(
    brokers: &str,
    topic: &str,
    table: &str,
    seconds: u64,
    rate: u64,
    x: &[(String, String)],
) {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers).set("linger.ms", "5");
    for (k, v) in x {
        if !k.starts_with("fetch.") && !k.starts_with("session.") && !k.starts_with("heartbeat.") {
            cfg.set(k, v);
        }
    }
    let producer: BaseProducer = cfg.create().expect("producer");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    let engine = rt.block_on(async {
        let t = toolspan_store::SpanTable::open_or_create(table)
            .await
            .expect("table");
        toolspan_query::Engine::with_table(t, toolspan_query::EngineOptions::default())
            .await
            .expect("engine")
    });
    let mut fleet = Fleet::new(FleetConfig {
        seed: 7,
        payloads: false,
        failure_scale: 1.0,
    });
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let mut seen: HashMap<String, Duration> = HashMap::new();
    let start = Instant::now();
    let gap = Duration::from_millis(1000 / rate.max(1));
    let mut next_send = Instant::now();
    let mut next_poll = Instant::now();
    let end_send = start + Duration::from_secs(seconds);
    let end_all = end_send + Duration::from_secs(60);
    while Instant::now() < end_all && (Instant::now() < end_send || seen.len() < sent.len()) {
        let now = Instant::now();
        if now < end_send && now >= next_send {
            let ns = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let req = fleet.request(1, ns, 0);
            let trace = req.resource_spans[0].scope_spans[0].spans[0]
                .trace_id
                .clone();
            let key = hex(&trace);
            let payload = req.encode_to_vec();
            if producer
                .send(BaseRecord::to(topic).payload(&payload).key(&key))
                .is_ok()
            {
                producer.poll(Duration::ZERO);
                sent.insert(key, Instant::now());
            }
            next_send += gap;
        }
        producer.poll(Duration::ZERO);
        if now >= next_poll {
            let pending: Vec<&String> = sent.keys().filter(|k| !seen.contains_key(*k)).collect();
            if !pending.is_empty() {
                let list = pending
                    .iter()
                    .map(|k| format!("'{k}'"))
                    .collect::<Vec<_>>()
                    .join(",");
                let sql = format!("SELECT DISTINCT trace_id FROM spans WHERE trace_id IN ({list})");
                if let Ok(batches) = rt.block_on(async {
                    let _ = engine.refresh().await;
                    engine.sql(&sql).await
                }) {
                    let t = Instant::now();
                    for b in batches {
                        let col = b.column(0);
                        let arr = arrow::array::cast::as_string_array(col);
                        for i in 0..arrow::array::Array::len(arr) {
                            let k = arr.value(i).to_string();
                            if let Some(s) = sent.get(&k) {
                                seen.entry(k).or_insert_with(|| t.duration_since(*s));
                            }
                        }
                    }
                }
            }
            next_poll = Instant::now() + Duration::from_millis(100);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut lat: Vec<f64> = seen.values().map(|d| d.as_secs_f64() * 1000.0).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
        }
    };
    println!(
        "markers={} seen={} p50_ms={:.0} p99_ms={:.0} max_ms={:.0}",
        sent.len(),
        seen.len(),
        pct(0.5),
        pct(0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
}

fn main() {
    // Logs of the engine under test, off unless asked for (`TOOLSPAN_BENCH_LOG=info`), on stderr
    // so the figures on stdout stay parseable.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env(
            "TOOLSPAN_BENCH_LOG",
        ))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("ceiling") if args.len() >= 5 => ceiling(
            &args[2],
            &args[3],
            args[4].parse().expect("MESSAGES"),
            &opts(&args[5..]),
        ),
        Some("freshness") if args.len() >= 7 => freshness(
            &args[2],
            &args[3],
            &args[4],
            args[5].parse().expect("SECONDS"),
            args[6].parse().expect("RATE"),
            &opts(&args[7..]),
        ),
        _ => {
            eprintln!("usage: kafka ceiling BROKERS TOPIC MESSAGES [-X k=v]... | kafka freshness BROKERS TOPIC TABLE SECONDS RATE [-X k=v]...");
            std::process::exit(2);
        }
    }
}
