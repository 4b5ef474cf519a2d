//! librdkafka client configuration shared by the consumer, the dead-letter producer and the
//! admin client.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::RDKafkaErrorCode;

/// librdkafka properties that only consumers know (the producer would warn about them).
pub(super) fn is_consumer_only(key: &str) -> bool {
    const PREFIXES: [&str; 12] = [
        "fetch.",
        "session.timeout",
        "heartbeat.",
        "group.",
        "auto.offset.reset",
        "max.poll",
        "partition.assignment",
        "enable.auto",
        "isolation.level",
        "queued.m",
        "auto.commit",
        "check.crcs",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p))
}

/// A client config: `base`, then toolspan's `defaults`, then the user's pass-through options.
pub(super) fn client_config(
    base: &ClientConfig,
    user: &[(String, String)],
    defaults: &[(&str, &str)],
) -> ClientConfig {
    let mut c = base.clone();
    for (k, v) in defaults {
        c.set(*k, *v);
    }
    for (k, v) in user {
        c.set(k, v);
    }
    c.set_log_level(RDKafkaLogLevel::Warning);
    c
}

/// Creates `topic` with the broker's default partitions and replication unless it exists.
/// Best effort: a broker that auto-creates topics or refuses admin requests still works.
pub(super) fn ensure_topic(
    base: &ClientConfig,
    user: &[(String, String)],
    topic: &str,
    handle: &tokio::runtime::Handle,
) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        client_config(base, user, &[]).create();
    let Ok(admin) = admin else { return };
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    match handle.block_on(admin.create_topics([&new], &opts)) {
        Ok(results) => {
            for r in results {
                match r {
                    Ok(t) => tracing::info!(topic = %t, "created the dead-letter topic"),
                    Err((t, RDKafkaErrorCode::TopicAlreadyExists)) => {
                        tracing::debug!(topic = %t, "dead-letter topic exists")
                    }
                    Err((t, e)) => {
                        tracing::warn!(topic = %t, error = %e, "could not create the dead-letter topic; relying on the broker")
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not create the dead-letter topic; relying on the broker")
        }
    }
}
