//! The load generator's pure parts: profiles and what the collector records.

use super::*;

#[test]
fn refusals_are_timed_apart_from_answers_and_other_errors() {
    let c = Collector::new().unwrap();
    c.record(Duration::from_millis(900), Ok(ServerTimes::default()));
    c.record(Duration::from_millis(3), Err("http_429".into()));
    c.record(Duration::from_millis(5), Err("http_503".into()));
    c.record(Duration::from_millis(2000), Err("http_504".into()));
    let refused = c.refusals.lock().unwrap().clone();
    assert_eq!(refused.len(), 2, "429 and 503 only");
    let max = LatencyMs::of(&refused).max;
    assert!((4.9..5.1).contains(&max), "{max}");
    assert_eq!(c.latencies.lock().unwrap().len(), 1);
    assert_eq!(c.errors.lock().unwrap().values().sum::<u64>(), 3);
}

#[test]
fn profiles_are_rate_and_seconds_steps_and_bad_ones_say_which_step() {
    assert_eq!(
        parse_profile("10:30, 60:5.5,10:30").unwrap(),
        Profile(vec![(10.0, 30.0), (60.0, 5.5), (10.0, 30.0)])
    );
    assert_eq!(
        parse_profile("10").unwrap_err(),
        "step \"10\" is not RATE:SECONDS"
    );
    assert!(parse_profile("10:30,0:5").unwrap_err().contains("rate \"0\""));
    assert!(parse_profile("10:x").unwrap_err().contains("seconds \"x\""));
}
