//! Which decoded frames a stream keeps: a target rate decided on presentation timestamps, so
//! the choice is the same whether frames arrive paced, in bursts or after a reconnect.

/// Keeps frames at most `fps` per second of stream time; `None` keeps every frame.
#[derive(Debug, Clone)]
pub struct FrameSampler {
    interval_90k: Option<i64>,
    next_due_90k: Option<i64>,
}

impl FrameSampler {
    /// `fps` of `None`, zero, negative or not finite keeps every frame.
    pub fn new(fps: Option<f64>) -> Self {
        let interval_90k = fps
            .filter(|f| f.is_finite() && *f > 0.0)
            .map(|f| ((90_000.0 / f).round() as i64).max(1));
        Self {
            interval_90k,
            next_due_90k: None,
        }
    }

    /// Whether the frame at `pts_90k` is kept. Frames are judged in display order.
    pub fn keep(&mut self, pts_90k: i64) -> bool {
        let Some(interval) = self.interval_90k else {
            return true;
        };
        let keep = match self.next_due_90k {
            None => true,
            // The stream restarted or jumped back (a reconnect, a loop without offsets):
            // start over rather than skipping until the old schedule comes round again.
            Some(due) if pts_90k < due - interval => true,
            Some(due) => pts_90k >= due,
        };
        if keep {
            // Advance by whole intervals from the schedule, so the average rate stays exact
            // when the stream's frame interval does not divide the sampling interval; after
            // a gap, the schedule restarts from this frame instead of bursting to catch up.
            let next = match self.next_due_90k {
                Some(due) if pts_90k >= due && pts_90k < due + interval => due + interval,
                _ => pts_90k + interval,
            };
            self.next_due_90k = Some(next);
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(sampler: &mut FrameSampler, frames: impl Iterator<Item = i64>) -> Vec<i64> {
        frames.filter(|&pts| sampler.keep(pts)).collect()
    }

    #[test]
    fn every_frame_without_a_target() {
        let mut s = FrameSampler::new(None);
        assert_eq!(kept(&mut s, (0..5).map(|i| i * 3600)).len(), 5);
        let mut s = FrameSampler::new(Some(0.0));
        assert_eq!(kept(&mut s, (0..5).map(|i| i * 3600)).len(), 5);
    }

    #[test]
    fn five_fps_from_twenty_five() {
        let mut s = FrameSampler::new(Some(5.0));
        let k = kept(&mut s, (0..50).map(|i| i * 3600));
        assert_eq!(k, (0..10).map(|i| i * 18_000).collect::<Vec<_>>());
    }

    #[test]
    fn average_rate_is_exact_when_intervals_do_not_divide() {
        // 30 fps source sampled at 7 fps for 10 s: 70 frames, not 60 or 100.
        let mut s = FrameSampler::new(Some(7.0));
        let k = kept(&mut s, (0..300).map(|i| i * 3000));
        assert!((69..=71).contains(&k.len()), "{}", k.len());
    }

    #[test]
    fn restarts_after_a_jump_back_and_does_not_burst_after_a_gap() {
        let mut s = FrameSampler::new(Some(1.0));
        assert!(s.keep(900_000));
        assert!(!s.keep(900_000 + 3600));
        assert!(s.keep(0), "stream restarted");
        assert!(!s.keep(3600));
        // A 10 s gap: one frame kept, then back to one a second.
        assert!(s.keep(900_000));
        assert!(!s.keep(900_000 + 45_000));
        assert!(s.keep(990_000));
    }
}
