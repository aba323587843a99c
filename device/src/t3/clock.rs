//! The device's clock: what vhost-user arms its timer with. The RDMA
//! function's engine runs on the same time base in its own type (smoltcp's
//! `Instant`); the conversion stays inside the device.

use std::time::Duration;

/// A point on the device's clock: microseconds since the device started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(i64);

impl Instant {
    pub const fn from_micros(micros: i64) -> Self {
        Self(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating.
    #[must_use]
    pub fn after(self, d: Duration) -> Self {
        Self(self.0.saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)))
    }

    /// How long from `self` until `later` (zero if it has passed).
    pub fn until(self, later: Self) -> Duration {
        Duration::from_micros(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }

    pub(crate) fn engine(self) -> vt3_iwarp::toe::Instant {
        vt3_iwarp::toe::Instant::from_micros(self.0)
    }

    pub(crate) fn from_engine(at: vt3_iwarp::toe::Instant) -> Self {
        Self(at.total_micros())
    }
}

/// The clock every part of one device reads.
#[derive(Debug)]
pub struct Clock {
    epoch: std::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self { epoch: std::time::Instant::now() }
    }
}

impl Clock {
    pub fn now(&self) -> Instant {
        Instant(i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_and_until_are_inverse_and_saturate() {
        let t = Instant::from_micros(1_000);
        let later = t.after(Duration::from_millis(20));
        assert_eq!(later.micros(), 21_000);
        assert_eq!(t.until(later), Duration::from_millis(20));
        assert_eq!(later.until(t), Duration::ZERO, "a passed instant is zero away");
        assert_eq!(Instant::from_micros(i64::MAX - 1).after(Duration::from_secs(1)).micros(), i64::MAX);
    }

    #[test]
    fn the_engine_sees_the_same_time() {
        let t = Instant::from_micros(123_456);
        assert_eq!(t.engine().total_micros(), 123_456);
        assert_eq!(Instant::from_engine(t.engine()), t);
    }
}
