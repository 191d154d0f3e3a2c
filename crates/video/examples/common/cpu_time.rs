//! The process's CPU time, for the examples that price decoding in cores.

/// This process's user and system CPU time so far, in seconds (Linux's /proc).
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at its closing ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; USER_HZ
    // is 100 on every Linux this runs on.
    (ticks(11) + ticks(12)) / 100.0
}
