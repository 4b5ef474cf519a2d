use super::*;

fn seen(tool: &str) -> Remember<'_> {
    Remember {
        stage: Stage::Call,
        pending: false,
        attempt: None,
        ids: (Some(tool), Some("c1"), None),
    }
}

#[test]
fn recalls_what_it_was_told_and_merges_children() {
    let m = TraceMemory::new(MemoryConfig::default());
    m.remember(vec![((1, 10), seen("search"))], vec![]);
    m.remember(
        vec![],
        vec![(
            (1, 10),
            Told {
                child_error: Some((5, ErrorType::Parse)),
                attempts_seen: 1,
                toolspan_call: None,
                mirror_failed: false,
            },
        )],
    );
    m.remember(
        vec![],
        vec![(
            (1, 10),
            Told {
                child_error: Some((3, ErrorType::Network)),
                attempts_seen: 2,
                toolspan_call: None,
                mirror_failed: false,
            },
        )],
    );
    let s = m.recall(&[(1, 10), (2, 10)]);
    let t = m.recall_told(&[(1, 10)]);
    assert_eq!(s[0].as_ref().and_then(|s| s.tool()), Some("search"));
    assert!(s[1].is_none(), "another trace's span id must not match");
    assert_eq!(
        t[0],
        Some(Told {
            child_error: Some((5, ErrorType::Parse)),
            attempts_seen: 2,
            toolspan_call: None,
            mirror_failed: false,
        }),
        "the latest failing child wins, attempts take the maximum"
    );
}

#[test]
fn caps_evict_the_oldest_and_count_them() {
    let m = TraceMemory::new(MemoryConfig {
        ttl: Duration::from_secs(60),
        max_entries: 100,
        max_bytes: usize::MAX,
    });
    for i in 0..1_000u64 {
        m.remember(vec![((7, i), seen("t"))], vec![]);
    }
    let st = m.stats();
    assert!(st.entries <= 100 && st.entries >= 50, "{st:?}");
    assert_eq!(st.evicted + st.entries, 1_000);
    let s = m.recall(&[(7, 0), (7, 999)]);
    assert!(
        s[0].is_none() && s[1].is_some(),
        "oldest forgotten, newest kept"
    );

    let b = TraceMemory::new(MemoryConfig {
        ttl: Duration::from_secs(60),
        max_entries: usize::MAX,
        max_bytes: 10_000,
    });
    for i in 0..1_000u64 {
        b.remember(vec![((7, i), seen(&"x".repeat(100)))], vec![]);
    }
    assert!(b.stats().bytes <= 10_000 + 300);
    assert!(b.stats().evicted > 900);
}

#[test]
fn a_huge_trace_is_recalled_span_by_span_and_later_entries_win() {
    let m = TraceMemory::new(MemoryConfig::default());
    // One trace with many spans, in pieces (as a flood of one trace's orphans comes).
    for chunk in (0..10_000u64).collect::<Vec<_>>().chunks(100) {
        m.remember(chunk.iter().map(|&i| ((9, i), seen("a"))), vec![]);
    }
    m.remember(vec![((9, 5), seen("b")), ((9, 5_000), seen("c"))], vec![]);
    let s = m.recall(&[(9, 0), (9, 5), (9, 5_000), (9, 9_999), (9, 10_000), (8, 1)]);
    let tools: Vec<Option<&str>> = s
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.tool()))
        .collect();
    assert_eq!(
        tools,
        [Some("a"), Some("b"), Some("c"), Some("a"), None, None]
    );
    assert_eq!(m.stats().entries, 10_000, "a span put again is one entry");
}

#[test]
fn a_calls_strings_come_back_as_they_went_in_across_rotations() {
    // Absent, empty and non-ASCII strings, shared by several spans, some of them
    // remembered just before a cap rotates the generation.
    let m = TraceMemory::new(MemoryConfig {
        max_entries: 8,
        ..MemoryConfig::default()
    });
    let ids: [IdsRef<'_>; 3] = [
        (Some("search_docs"), Some("call-1"), None),
        (None, Some(""), Some("agent-ü")),
        (None, None, None),
    ];
    let mut spans = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        for k in 0..2u64 {
            let s = Remember {
                stage: Stage::Attempt,
                pending: k == 1,
                attempt: (k == 0).then_some(i as i64),
                ids: *id,
            };
            spans.push(((7, 10 * i as u64 + k), s));
        }
    }
    m.remember(spans.clone(), vec![]);
    let keys: Vec<Key> = spans.iter().map(|(k, _)| *k).collect();
    let back = m.recall(&keys);
    for ((_, want), got) in spans.iter().zip(&back) {
        let got = got.as_ref().expect("remembered");
        assert_eq!(
            (got.stage, got.pending, got.attempt),
            (want.stage, want.pending, want.attempt)
        );
        assert_eq!((got.tool(), got.call_id(), got.agent()), want.ids);
        assert_eq!(got.ids.is_none(), want.ids == (None, None, None));
    }
    assert_eq!(back[2].as_ref().and_then(|s| s.call_id()), Some(""));
    assert_eq!(back[3].as_ref().and_then(|s| s.agent()), Some("agent-ü"));
    assert_eq!(back[4].as_ref().and_then(|s| s.tool()), None);
}

#[test]
fn many_calls_in_one_request_keep_their_own_strings() {
    // More calls than the look-back of shared strings, interleaved, in one trace and
    // across traces: every span recalls its own call's strings.
    let m = TraceMemory::new(MemoryConfig::default());
    let names: Vec<String> = (0..40).map(|i| format!("call-{i}")).collect();
    let mut spans = Vec::new();
    for round in 0..3u64 {
        for (i, name) in names.iter().enumerate() {
            let r = Remember {
                stage: Stage::Execute,
                pending: false,
                attempt: Some(round as i64),
                ids: (Some("tool"), Some(name), Some("agent")),
            };
            spans.push((((i % 3) as u128 + 1, 1000 * round + i as u64), r));
        }
    }
    // Grouped by trace as a request files them.
    spans.sort_by_key(|((t, _), _)| *t);
    m.remember(spans.clone(), vec![]);
    let back = m.recall(&spans.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    for ((_, want), got) in spans.iter().zip(&back) {
        let got = got.as_ref().expect("remembered");
        assert_eq!(got.call_id(), want.ids.1);
        assert_eq!(got.attempt, want.attempt);
    }
    assert_eq!(m.stats().entries, 120);
}

#[test]
fn a_calls_spans_share_one_copy_of_its_strings() {
    let m = TraceMemory::new(MemoryConfig::default());
    let ids = (Some("search_docs"), Some("call-7"), Some("support-bot"));
    let spans: Vec<(Key, Remember<'_>)> = [Stage::Call, Stage::Attempt, Stage::Send]
        .into_iter()
        .enumerate()
        .map(|(i, stage)| {
            let r = Remember {
                stage,
                pending: false,
                attempt: Some(1),
                ids,
            };
            ((5, i as u64 + 1), r)
        })
        .collect();
    m.remember(spans, vec![]);
    let record = 12 + "search_docs".len() + "call-7".len() + "support-bot".len();
    assert_eq!(m.stats().bytes as usize, 3 * SEEN_OVERHEAD + record);
}

#[test]
fn entries_expire() {
    let m = TraceMemory::new(MemoryConfig {
        ttl: Duration::from_millis(20),
        ..MemoryConfig::default()
    });
    m.remember(vec![((1, 1), seen("t"))], vec![]);
    let s = m.recall(&[(1, 1)]);
    assert!(s[0].is_some(), "kept for at least the TTL");
    std::thread::sleep(Duration::from_millis(50));
    let s = m.recall(&[(1, 1)]);
    assert!(s[0].is_none());
    assert_eq!(m.stats().entries, 0);
    assert_eq!(m.stats().evicted, 0, "expiry is not eviction");
}
