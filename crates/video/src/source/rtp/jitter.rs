//! A bounded reordering buffer for RTP packets, as plain state: `push(packet, now)` files
//! a packet by its sequence number, `pop_ready(now)` releases packets in order. A gap is
//! waited for until a packet has been held `max_delay` or `depth` packets are held, then
//! declared lost (the next packet carries how many were skipped, so a depacketizer drops
//! what it was assembling). Sequence numbers are extended past their 16-bit wrap; a jump
//! far outside the window (a camera restarting its sequence) starts afresh.
//! No clock and no channel: time comes in as arguments, so tests need neither.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::packet::RtpPacket;

/// A packet further than this behind or ahead of the window restarts the sequence.
const RESTART_DISTANCE: u64 = 3_000;
/// Late packets in a row that restart the sequence too: a sender that started again a
/// little behind where it was (a camera looping a file, an encoder restarted with the same
/// initial number) is not reordering that much, and would otherwise be dropped as late
/// until its numbers caught up.
const LATE_RUN_RESTARTS: u32 = 64;

/// How long and how much the buffer waits for a missing packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JitterConfig {
    /// Packets held at most; one more releases the oldest gap as lost.
    pub depth: usize,
    /// A packet waits at most this long for the ones before it.
    pub max_delay: Duration,
}

impl Default for JitterConfig {
    fn default() -> Self {
        // A 4 Mbit/s camera sends about 360 packets of 1,400 bytes per second: 128 packets
        // or 150 ms covers the reordering of a LAN or a Wi-Fi hop without adding latency
        // where nothing is lost (in-order packets leave at once).
        Self {
            depth: 128,
            max_delay: Duration::from_millis(150),
        }
    }
}

/// What became of a pushed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Held,
    /// Its place was already released (given up as lost): dropped.
    Late,
    /// The same sequence number is already held: dropped.
    Duplicate,
    /// Far from the window: the buffer started afresh at this packet (what it held first
    /// goes out in order; the jump is not counted as loss).
    Restarted,
}

/// Counts since the buffer was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JitterStats {
    pub received: u64,
    pub lost: u64,
    pub late: u64,
    pub duplicates: u64,
    pub restarts: u64,
}

/// A packet released in order, with the number of packets skipped just before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub packet: RtpPacket,
    pub lost_before: u64,
}

#[derive(Debug)]
pub struct JitterBuffer {
    config: JitterConfig,
    /// Extended sequence number of the next packet to release.
    next: Option<u64>,
    /// Held packets by extended sequence number, with their arrival.
    held: BTreeMap<u64, (Instant, RtpPacket)>,
    /// After a restart, the old sequence's packets still go out first; the new sequence
    /// starts here once they have.
    restart_at: Option<u64>,
    /// Late packets in a row.
    late_run: u32,
    stats: JitterStats,
}

impl JitterBuffer {
    pub fn new(config: JitterConfig) -> Self {
        Self {
            config: JitterConfig {
                depth: config.depth.max(1),
                ..config
            },
            next: None,
            held: BTreeMap::new(),
            restart_at: None,
            late_run: 0,
            stats: JitterStats::default(),
        }
    }

    pub fn stats(&self) -> JitterStats {
        self.stats
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The extended sequence number nearest to `reference` with these low 16 bits.
    fn extend(reference: u64, sequence: u16) -> u64 {
        let candidate = (reference & !0xFFFF) | u64::from(sequence);
        if candidate + 0x8000 < reference {
            candidate + 0x1_0000
        } else if candidate > reference + 0x8000 && candidate >= 0x1_0000 {
            candidate - 0x1_0000
        } else {
            candidate
        }
    }

    pub fn push(&mut self, packet: RtpPacket, now: Instant) -> Pushed {
        self.stats.received += 1;
        // Start well above zero so that extension never goes negative.
        let next = *self
            .next
            .get_or_insert(0x1_0000_0000 | u64::from(packet.sequence));
        let reference = self.held.keys().next_back().copied().unwrap_or(next).max(next);
        let ext = Self::extend(reference, packet.sequence);
        let far = ext + RESTART_DISTANCE < next || ext > reference + RESTART_DISTANCE;
        self.late_run = if ext < next { self.late_run + 1 } else { 0 };
        if far || self.late_run >= LATE_RUN_RESTARTS {
            self.late_run = 0;
            self.stats.restarts += 1;
            // The new sequence numbers follow everything held, out of reach of old ones.
            let base = (reference + 0x2_0000) & !0xFFFF;
            let ext = base | u64::from(packet.sequence);
            self.restart_at = Some(ext);
            self.held.insert(ext, (now, packet));
            return Pushed::Restarted;
        }
        if ext < next {
            self.stats.late += 1;
            return Pushed::Late;
        }
        if self.held.contains_key(&ext) {
            self.stats.duplicates += 1;
            return Pushed::Duplicate;
        }
        self.held.insert(ext, (now, packet));
        Pushed::Held
    }

    /// The next packet in order, if it is here or the gap before it has been waited out.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Released> {
        let next = self.next?;
        let (&first, _) = self.held.first_key_value()?;
        if first == next {
            return self.release(first, 0);
        }
        if self.restart_at == Some(first) {
            // Everything of the old sequence has gone out: the new one starts here.
            self.restart_at = None;
            return self.release(first, 0);
        }
        let waited_out = self
            .oldest_arrival()
            .is_some_and(|t| now.saturating_duration_since(t) >= self.config.max_delay);
        if self.held.len() > self.config.depth || waited_out {
            let lost = first - next;
            self.stats.lost += lost;
            return self.release(first, lost);
        }
        None
    }

    /// When `pop_ready` will give up on the gap now waited for (`None`: nothing waits).
    pub fn deadline(&self) -> Option<Instant> {
        let next = self.next?;
        let (&first, _) = self.held.first_key_value()?;
        if first == next || self.restart_at == Some(first) {
            return None;
        }
        self.oldest_arrival().map(|t| t + self.config.max_delay)
    }

    fn oldest_arrival(&self) -> Option<Instant> {
        self.held.values().map(|(t, _)| *t).min()
    }

    fn release(&mut self, ext: u64, lost_before: u64) -> Option<Released> {
        let (_, packet) = self.held.remove(&ext)?;
        self.next = Some(ext + 1);
        Some(Released { packet, lost_before })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn p(sequence: u16) -> RtpPacket {
        RtpPacket {
            marker: false,
            payload_type: 96,
            sequence,
            timestamp: 0,
            ssrc: 1,
            csrc_count: 0,
            extension_profile: None,
            payload: Bytes::new(),
        }
    }

    fn drain(jb: &mut JitterBuffer, now: Instant) -> Vec<(u16, u64)> {
        std::iter::from_fn(|| jb.pop_ready(now))
            .map(|r| (r.packet.sequence, r.lost_before))
            .collect()
    }

    fn buffer(depth: usize) -> JitterBuffer {
        JitterBuffer::new(JitterConfig {
            depth,
            max_delay: Duration::from_millis(100),
        })
    }

    #[test]
    fn in_order_packets_leave_at_once() {
        let t = Instant::now();
        let mut jb = buffer(8);
        for s in 10..13 {
            assert_eq!(jb.push(p(s), t), Pushed::Held);
            assert_eq!(drain(&mut jb, t), vec![(s, 0)]);
        }
        assert_eq!(jb.deadline(), None);
    }

    #[test]
    fn reordered_packets_leave_in_order() {
        let t = Instant::now();
        let mut jb = buffer(8);
        jb.push(p(1), t);
        jb.push(p(3), t);
        jb.push(p(4), t);
        assert_eq!(drain(&mut jb, t), vec![(1, 0)]);
        assert_eq!(jb.deadline(), Some(t + Duration::from_millis(100)));
        jb.push(p(2), t + Duration::from_millis(20));
        assert_eq!(drain(&mut jb, t), vec![(2, 0), (3, 0), (4, 0)]);
        assert_eq!(jb.stats().lost, 0);
    }

    #[test]
    fn a_gap_is_given_up_after_the_delay_and_late_packets_are_dropped() {
        let t = Instant::now();
        let mut jb = buffer(8);
        jb.push(p(1), t);
        jb.push(p(4), t + Duration::from_millis(10));
        assert_eq!(drain(&mut jb, t + Duration::from_millis(50)), vec![(1, 0)]);
        assert_eq!(drain(&mut jb, t + Duration::from_millis(109)), vec![]);
        assert_eq!(drain(&mut jb, t + Duration::from_millis(110)), vec![(4, 2)]);
        assert_eq!(jb.push(p(2), t), Pushed::Late);
        assert_eq!(jb.push(p(4), t), Pushed::Late);
        let s = jb.stats();
        assert_eq!((s.lost, s.late), (2, 2));
    }

    #[test]
    fn a_full_buffer_gives_up_the_gap_at_once() {
        let t = Instant::now();
        let mut jb = buffer(3);
        jb.push(p(0), t);
        drain(&mut jb, t);
        for s in 2..5 {
            jb.push(p(s), t);
        }
        assert_eq!(drain(&mut jb, t), vec![]);
        jb.push(p(5), t);
        assert_eq!(drain(&mut jb, t), vec![(2, 1), (3, 0), (4, 0), (5, 0)]);
    }

    #[test]
    fn duplicates_are_dropped() {
        let t = Instant::now();
        let mut jb = buffer(8);
        jb.push(p(7), t);
        jb.push(p(9), t);
        assert_eq!(jb.push(p(9), t), Pushed::Duplicate);
        assert_eq!(jb.stats().duplicates, 1);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let t = Instant::now();
        let mut jb = buffer(8);
        jb.push(p(65534), t);
        jb.push(p(1), t);
        jb.push(p(65535), t);
        jb.push(p(0), t);
        assert_eq!(drain(&mut jb, t), vec![(65534, 0), (65535, 0), (0, 0), (1, 0)]);
        // Many wraps later, still in order.
        let mut s = 2u16;
        for _ in 0..200_000 {
            jb.push(p(s), t);
            assert_eq!(drain(&mut jb, t), vec![(s, 0)]);
            s = s.wrapping_add(1);
        }
        assert_eq!(jb.stats().lost + jb.stats().restarts, 0);
    }

    #[test]
    fn a_restarted_sequence_follows_what_was_held() {
        let t = Instant::now();
        let mut jb = buffer(8);
        jb.push(p(100), t);
        drain(&mut jb, t);
        jb.push(p(102), t);
        assert_eq!(jb.push(p(40_000), t), Pushed::Restarted);
        jb.push(p(40_001), t);
        // The old gap is still waited for; then the new sequence follows without loss.
        assert_eq!(drain(&mut jb, t), vec![]);
        let later = t + Duration::from_millis(100);
        assert_eq!(drain(&mut jb, later), vec![(102, 1), (40_000, 0), (40_001, 0)]);
        jb.push(p(40_002), later);
        assert_eq!(drain(&mut jb, later), vec![(40_002, 0)]);
        assert_eq!(jb.stats().restarts, 1);
        // Far behind is a restart too, not a flood of late packets.
        assert_eq!(jb.push(p(5), later), Pushed::Restarted);
        assert_eq!(drain(&mut jb, later), vec![(5, 0)]);
    }

    #[test]
    fn a_sender_starting_again_a_little_behind_restarts_after_a_run_of_late_packets() {
        let t = Instant::now();
        let mut jb = buffer(8);
        for s in 1_000..1_700 {
            jb.push(p(s), t);
        }
        drain(&mut jb, t);
        // The same numbers again (a camera looping its clip with the same sequence).
        let pushed: Vec<Pushed> = (1_000..1_100).map(|s| jb.push(p(s), t)).collect();
        let late = pushed.iter().take_while(|x| **x == Pushed::Late).count();
        assert_eq!(late, LATE_RUN_RESTARTS as usize - 1);
        assert_eq!(pushed[late], Pushed::Restarted);
        assert!(pushed[late + 1..].iter().all(|x| *x == Pushed::Held));
        let released = drain(&mut jb, t);
        assert_eq!(released.first(), Some(&(1_063, 0)));
        assert_eq!(released.len(), 100 - late);
        // A few late packets among good ones are only late.
        jb.push(p(1_100), t);
        assert_eq!(jb.push(p(1_050), t), Pushed::Late);
        jb.push(p(1_101), t);
        assert_eq!(jb.push(p(1_051), t), Pushed::Late);
    }
}
