//! Whether requests that allow it should go to the model's fallback, as plain state: a
//! hysteresis band on the wait a new request can expect. The queue task asks
//! [`Divert::observe`] after every dispatch and publishes the answer for admission to read.
//!
//! It starts diverting when the expected wait passes the objective (a request admitted now
//! would break it before its own batch even runs) and stops only once the wait is back
//! under half of it: between the two marks it keeps its last answer, so that requests do
//! not alternate between the models at the edge of the objective.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Divert {
    above: Duration,
    below: Duration,
    diverting: bool,
}

impl Divert {
    /// Diverts above `objective`, returns below half of it.
    pub fn new(objective: Duration) -> Self {
        Self {
            above: objective,
            below: objective / 2,
            diverting: false,
        }
    }

    /// Takes the wait a request arriving now can expect; answers whether to divert.
    pub fn observe(&mut self, expected_wait: Duration) -> bool {
        if self.diverting {
            self.diverting = expected_wait >= self.below;
        } else {
            self.diverting = expected_wait > self.above;
        }
        self.diverting
    }

    pub fn diverting(&self) -> bool {
        self.diverting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn diverts_above_the_objective_and_returns_only_below_half_of_it() {
        let mut d = Divert::new(100 * MS);
        let answers: Vec<bool> = [50, 100, 101, 99, 60, 51, 50, 49, 99, 100, 150]
            .into_iter()
            .map(|ms| d.observe(ms * MS))
            .collect();
        assert_eq!(
            answers,
            [false, false, true, true, true, true, true, false, false, false, true]
        );
    }

    #[test]
    fn a_wait_jittering_around_the_objective_does_not_flap() {
        let mut d = Divert::new(100 * MS);
        d.observe(120 * MS);
        let changes = [95, 105, 90, 110, 80, 120]
            .into_iter()
            .map(|ms| d.observe(ms * MS))
            .filter(|&on| !on)
            .count();
        assert_eq!(changes, 0, "stays diverted within the band");
    }
}
