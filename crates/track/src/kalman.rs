//! The box filter: `trackers`' `XYXYStateEstimator` with ByteTrack's noise.
//!
//! The state is the four corners `(x1, y1, x2, y2)` and their velocities, constant-velocity
//! motion over one frame, all four corners measured directly. Initial covariance is the
//! identity, process noise `0.01 I` and measurement noise `0.1 I` (`ByteTrackTracklet.
//! _configure_noise`). Every matrix is block-diagonal over the (corner, its velocity) pairs and
//! the blocks start and evolve identically, so one 2x2 covariance serves all four corners: the
//! same numbers as `trackers`' 8x8 algebra at a fraction of the work.

use peregrine_types::BBox;

const PROCESS_NOISE: f64 = 0.01;
const MEASUREMENT_NOISE: f64 = 0.1;

/// A box as `[x1, y1, x2, y2]` in `f64`, the precision the filter runs in.
pub type Corners = [f64; 4];

pub fn corners(bbox: &BBox) -> Corners {
    [bbox.x1.into(), bbox.y1.into(), bbox.x2.into(), bbox.y2.into()]
}

#[derive(Debug, Clone, PartialEq)]
pub struct BoxFilter {
    position: Corners,
    velocity: Corners,
    /// `[[pp, pv], [vp, vv]]`, shared by the four corners.
    covariance: [[f64; 2]; 2],
}

impl BoxFilter {
    pub fn new(first: Corners) -> Self {
        Self {
            position: first,
            velocity: [0.0; 4],
            covariance: [[1.0, 0.0], [0.0, 1.0]],
        }
    }

    pub fn position(&self) -> Corners {
        self.position
    }

    /// One frame of constant-velocity motion: `x = F x`, `P = F P F' + Q`.
    pub fn predict(&mut self) {
        for (p, v) in self.position.iter_mut().zip(self.velocity) {
            *p += v;
        }
        let [[pp, pv], [vp, vv]] = self.covariance;
        // F P with F = [[1, 1], [0, 1]], then (F P) F'.
        let (fp00, fp01, fp10, fp11) = (pp + vp, pv + vv, vp, vv);
        self.covariance = [
            [fp00 + fp01 + PROCESS_NOISE, fp01],
            [fp10 + fp11, fp11 + PROCESS_NOISE],
        ];
    }

    /// Folds in a measured box, with the Joseph-form covariance update `trackers` uses.
    pub fn update(&mut self, measured: Corners) {
        let [[pp, pv], [vp, vv]] = self.covariance;
        let innovation_variance = pp + MEASUREMENT_NOISE;
        // `trackers` multiplies by the inverse rather than dividing: keep its rounding.
        let inverse = 1.0 / innovation_variance;
        let (gain_p, gain_v) = (pp * inverse, vp * inverse);
        for ((p, v), z) in self.position.iter_mut().zip(&mut self.velocity).zip(measured) {
            let innovation = z - *p;
            *p += gain_p * innovation;
            *v += gain_v * innovation;
        }
        // (I - K H) P (I - K H)' + K R K', with I - K H = [[1 - kp, 0], [-kv, 1]].
        let (a00, a10) = (1.0 - gain_p, -gain_v);
        let (ap00, ap01) = (a00 * pp, a00 * pv);
        let (ap10, ap11) = (a10 * pp + vp, a10 * pv + vv);
        self.covariance = [
            [
                ap00 * a00 + gain_p * MEASUREMENT_NOISE * gain_p,
                ap00 * a10 + ap01 + gain_p * MEASUREMENT_NOISE * gain_v,
            ],
            [
                ap10 * a00 + gain_v * MEASUREMENT_NOISE * gain_p,
                ap10 * a10 + ap11 + gain_v * MEASUREMENT_NOISE * gain_v,
            ],
        ];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_predict_stays_put_and_grows_the_covariance() {
        let mut f = BoxFilter::new([10.0, 20.0, 30.0, 40.0]);
        f.predict();
        assert_eq!(f.position(), [10.0, 20.0, 30.0, 40.0]);
        // F I F' + Q = [[2, 1], [1, 1]] + 0.01 I.
        assert_eq!(f.covariance, [[2.01, 1.0], [1.0, 1.01]]);
    }

    #[test]
    fn update_matches_trackers_numbers() {
        // trackers 2.6.1: ByteTrackTracklet([0, 0, 10, 10]); predict(); update([2, 0, 12, 10]);
        // predict() gives state_to_bbox() = [2.8530..., 0, 12.8530..., 10].
        let mut f = BoxFilter::new([0.0, 0.0, 10.0, 10.0]);
        f.predict();
        f.update([2.0, 0.0, 12.0, 10.0]);
        // K = [2.01, 1.0] / 2.11.
        assert!((f.position()[0] - 2.0 * 2.01 / 2.11).abs() < 1e-12);
        assert!((f.velocity[0] - 2.0 / 2.11).abs() < 1e-12);
        f.predict();
        let expected = 2.0 * 2.01 / 2.11 + 2.0 / 2.11;
        assert!((f.position()[0] - expected).abs() < 1e-12);
        assert!((f.position()[2] - (10.0 + expected)).abs() < 1e-12);
    }

    #[test]
    fn converges_on_a_steady_motion() {
        let mut f = BoxFilter::new([0.0, 0.0, 10.0, 10.0]);
        for step in 1..=60 {
            f.predict();
            let x = 3.0 * step as f64;
            f.update([x, 0.0, x + 10.0, 10.0]);
        }
        f.predict();
        assert!((f.position()[0] - 183.0).abs() < 0.5, "{:?}", f.position());
        assert!((f.velocity[0] - 3.0).abs() < 0.05);
    }
}
