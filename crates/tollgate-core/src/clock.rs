//! How far a server's clock is from its storage's, and whether that is too far.
//!
//! Servers sharing a database decide expiries and the reclaim boundary with
//! their own clocks. A server whose clock runs ahead reclaims leases that the
//! others still honour, and usage reported against them is then rejected:
//! units lost. So each server compares its clock with the database's, which
//! every server shares, and stops serving while the difference may exceed a
//! bound chosen well inside the reclaim grace.
//!
//! One sample is a reading of the storage clock taken between two readings
//! of the server's own: the storage read its clock at some instant between
//! them, so the offset is known up to half the interval.

use jiff::{SignedDuration, Timestamp};

/// One comparison of the two clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The storage's clock minus this server's: positive when the server is
    /// behind.
    pub offset: SignedDuration,
    /// How far the true offset may be from `offset`, either way.
    pub uncertainty: SignedDuration,
}

impl ClockSample {
    /// A sample from this server's clock read at `before` and `after`, and
    /// the storage's clock read in between. `None` when the readings are out
    /// of order (the server's clock stepped back) or too far apart to subtract.
    pub fn new(before: Timestamp, storage: Timestamp, after: Timestamp) -> Option<Self> {
        let round_trip = after.duration_since(before);
        if round_trip.is_negative() {
            return None;
        }
        let uncertainty = round_trip / 2;
        let midpoint = before.checked_add(uncertainty).ok()?;
        let offset = storage.duration_since(midpoint);
        Some(Self { offset, uncertainty })
    }

    /// Whether the clocks are certainly further apart than `bound`: even the
    /// nearest offset this sample allows exceeds it. A slow round trip widens
    /// the uncertainty and so never makes a server look skewed by itself.
    pub fn exceeds(&self, bound: SignedDuration) -> bool {
        let distance = self.offset.abs();
        distance.checked_sub(self.uncertainty).is_some_and(|nearest| nearest > bound)
    }

    /// Of several samples, the one with the smallest uncertainty.
    pub fn best(samples: impl IntoIterator<Item = ClockSample>) -> Option<ClockSample> {
        samples.into_iter().min_by_key(|sample| sample.uncertainty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).expect("instant")
    }

    fn ms(ms: i64) -> SignedDuration {
        SignedDuration::from_millis(ms)
    }

    #[test]
    fn offset_is_measured_from_the_midpoint_with_half_the_round_trip() {
        let sample = ClockSample::new(at(1_000), at(6_010), at(1_020)).expect("ordered");
        assert_eq!(sample, ClockSample { offset: ms(5_000), uncertainty: ms(10) });
        let behind = ClockSample::new(at(1_000), at(990), at(1_000)).expect("ordered");
        assert_eq!(behind, ClockSample { offset: ms(-10), uncertainty: ms(0) });
    }

    #[test]
    fn a_clock_that_stepped_back_gives_no_sample() {
        assert_eq!(ClockSample::new(at(2_000), at(2_000), at(1_999)), None);
        assert_eq!(ClockSample::new(Timestamp::MAX, Timestamp::MAX, Timestamp::MAX).map(|s| s.offset), Some(ms(0)));
    }

    #[test]
    fn only_an_offset_certainly_beyond_the_bound_exceeds_it() {
        let bound = ms(1_000);
        let sample = |offset: i64, uncertainty: i64| ClockSample { offset: ms(offset), uncertainty: ms(uncertainty) };
        // Exactly at the bound is within it; one past is beyond, either way.
        assert!(!sample(1_000, 0).exceeds(bound));
        assert!(sample(1_001, 0).exceeds(bound));
        assert!(!sample(-1_000, 0).exceeds(bound));
        assert!(sample(-1_001, 0).exceeds(bound));
        // The uncertainty is given to the server: only the nearest offset counts.
        assert!(!sample(1_500, 500).exceeds(bound));
        assert!(sample(1_502, 501).exceeds(bound));
        assert!(!sample(-1_500, 500).exceeds(bound));
        // An uncertainty larger than the offset never exceeds.
        assert!(!sample(3_000, 4_000).exceeds(ms(0)));
        assert!(sample(1, 0).exceeds(ms(0)));
    }

    #[test]
    fn the_best_sample_is_the_most_certain() {
        let samples = [
            ClockSample { offset: ms(7), uncertainty: ms(30) },
            ClockSample { offset: ms(3), uncertainty: ms(2) },
            ClockSample { offset: ms(9), uncertainty: ms(5) },
        ];
        assert_eq!(ClockSample::best(samples), Some(samples[1]));
        assert_eq!(ClockSample::best([]), None);
    }
}
