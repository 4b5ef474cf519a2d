//! The statistics and the request checks of `compare`.

use super::*;

#[test]
fn rates_that_differ_clearly_are_significant_and_equal_ones_are_not() {
    let m = rate("r", None, (10, 100), (60, 100), "lower");
    assert!(m.p_value.unwrap() < 1e-6);
    let [l, h] = m.ci95.unwrap();
    assert!(l > 0.35 && h < 0.65 && l < 0.5 && h > 0.5, "{l} {h}");
    let same = rate("r", None, (10, 100), (11, 100), "lower");
    assert!(same.p_value.unwrap() > 0.5);
    let zero = rate("r", None, (0, 50), (0, 70), "lower");
    assert_eq!(zero.p_value, Some(1.0));
    let empty = rate("r", None, (0, 0), (3, 10), "lower");
    assert_eq!(empty.p_value, None);
}

#[test]
fn a_textbook_two_proportion_test() {
    // 45/100 vs 60/100: z = 2.1239, two-sided p = 0.0337.
    let m = rate("r", None, (45, 100), (60, 100), "higher");
    assert!(
        (m.p_value.unwrap() - 0.0337).abs() < 5e-4,
        "{:?}",
        m.p_value
    );
}

#[test]
fn mann_whitney_sees_shifted_samples_and_not_identical_ones() {
    let b: Vec<f64> = (0..40).map(|i| 2.0 + f64::from(i % 3)).collect();
    let a: Vec<f64> = (0..40).map(|_| 2.0).collect();
    assert!(mann_whitney(&b, &a).unwrap() < 1e-4);
    assert!(mann_whitney(&a, &a).unwrap() > 0.9);
    assert_eq!(mann_whitney(&[], &a), None);
    assert_eq!(quantile(&[2.0, 2.0, 3.0, 4.0], 0.5), Some(2.0));
    assert_eq!(quantile(&[2.0, 2.0, 3.0, 4.0], 0.9), Some(4.0));
}

#[test]
fn holm_keeps_a_family_of_noise_insignificant() {
    // Ten metrics with p = 0.02 each are not significant after adjustment; one with
    // p = 1e-6 stays significant.
    let mut ms: Vec<Metric> = (0..10)
        .map(|_| {
            let mut m = rate("r", None, (10, 100), (12, 100), "lower");
            m.p_value = Some(0.02);
            m
        })
        .collect();
    let mut strong = rate("s", None, (10, 100), (60, 100), "lower");
    strong.p_value = Some(1e-6);
    ms.push(strong);
    holm(&mut ms);
    assert!(ms[..10]
        .iter()
        .all(|m| m.verdict == "no significant difference"));
    assert_eq!(ms[10].verdict, "worse");
}

#[test]
fn requests_are_checked() {
    let base = CompareRequest {
        tool: "t".into(),
        before: "1".into(),
        after: "2".into(),
        service: None,
        since: None,
        until: None,
    };
    assert!(base.filter("start_time").is_ok());
    let same = CompareRequest {
        after: "1".into(),
        ..base.clone()
    };
    assert_eq!(
        same.filter("start_time").unwrap_err().code,
        Code::InvalidArgument
    );
    let quote = CompareRequest {
        tool: "it's".into(),
        ..base.clone()
    };
    assert!(quote.filter("start_time").unwrap().contains("'it''s'"));
    let control = CompareRequest {
        tool: "a\u{0}b".into(),
        ..base
    };
    assert!(control.filter("start_time").is_err());
}
