//! Unit domains and checked counter arithmetic.
//!
//! Units are `u64` everywhere in the core; a store's domain bounds them further.
//! The memory store admits the whole `u64` range, PostgreSQL's `BIGINT` columns
//! admit `0..=i64::MAX`. Every counter update goes through [`UnitDomain::add`], so
//! an overflow is a typed refusal, never a panic or a wrap.

use crate::error::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitDomain {
    max: u64,
}

impl UnitDomain {
    /// The memory store's domain, `0..=u64::MAX`.
    pub const U64: UnitDomain = UnitDomain { max: u64::MAX };
    /// PostgreSQL's domain, nonnegative `BIGINT`: `0..=i64::MAX`.
    pub const I64: UnitDomain = UnitDomain { max: i64::MAX as u64 };

    pub fn max(self) -> u64 {
        self.max
    }

    pub fn contains(self, units: u64) -> bool {
        units <= self.max
    }

    /// `units` if it is inside the domain, else `units_out_of_range`.
    pub fn check(self, units: u64) -> Result<u64, Error> {
        if self.contains(units) { Ok(units) } else { Err(Error::UnitsOutOfRange { units, max: self.max }) }
    }

    /// `a + b` if the sum stays inside the domain.
    pub fn add(self, a: u64, b: u64) -> Option<u64> {
        a.checked_add(b).filter(|sum| self.contains(*sum))
    }

    /// `a + b`, or `counter_overflow` naming the counter.
    pub fn add_counter(self, counter: &'static str, a: u64, b: u64) -> Result<u64, Error> {
        self.add(a, b).ok_or(Error::CounterOverflow { counter })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_bound_sums() {
        let i = UnitDomain::I64;
        let max = i64::MAX as u64;
        assert_eq!(i.max(), max);
        assert_eq!(UnitDomain::U64.max(), u64::MAX);
        assert!(i.contains(max));
        assert!(!i.contains(max + 1));
        assert_eq!(i.check(max), Ok(max));
        assert_eq!(i.check(max + 1), Err(Error::UnitsOutOfRange { units: max + 1, max }));
        assert_eq!(i.add(max - 1, 1), Some(max));
        assert_eq!(i.add(max, 1), None);
        assert_eq!(UnitDomain::U64.add(u64::MAX, 0), Some(u64::MAX));
        assert_eq!(UnitDomain::U64.add(u64::MAX, 1), None);
        assert_eq!(
            UnitDomain::U64.add_counter("billed", u64::MAX, 1),
            Err(Error::CounterOverflow { counter: "billed" })
        );
        assert_eq!(UnitDomain::U64.add_counter("billed", 2, 3), Ok(5));
    }
}
