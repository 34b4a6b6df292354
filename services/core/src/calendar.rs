//! Calendar days, shared by backfill ranges and the pollers' DATE partitions.

use std::fmt;

/// A calendar day (proleptic Gregorian), numbered as days since 1970-01-01 the way
/// Paimon, Iceberg and Avro store a DATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day {
    pub y: i64,
    pub m: i64,
    pub d: i64,
}

impl Day {
    /// `YYYY-MM-DD`; None for anything else, Feb 30 included.
    pub fn parse(s: &str) -> Option<Day> {
        let b = s.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let y = s[0..4].parse().ok()?;
        let m = s[5..7].parse().ok()?;
        let d = s[8..10].parse().ok()?;
        let day = Day { y, m, d };
        // A day that does not survive the round trip (Feb 30) is no date.
        let real = (1..=12).contains(&m) && d >= 1 && Day::from_number(day.number()) == day;
        real.then_some(day)
    }

    /// Days since 1970-01-01 (Howard Hinnant's days_from_civil / civil_from_days).
    pub fn number(self) -> i64 {
        let y = if self.m <= 2 { self.y - 1 } else { self.y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (self.m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + self.d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    pub fn from_number(z: i64) -> Day {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        Day { y, m, d }
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.y, self.m, self.d)
    }
}

#[cfg(test)]
mod tests {
    use super::Day;

    #[test]
    fn days_round_trip_through_their_number() {
        assert_eq!(Day::from_number(0).to_string(), "1970-01-01");
        assert_eq!(Day::from_number(20_058).to_string(), "2024-12-01");
        assert_eq!(Day::from_number(-1).to_string(), "1969-12-31");
        let leap = Day::parse("2024-02-29").expect("a leap day");
        assert_eq!(Day::from_number(leap.number()), leap);
        assert_eq!(Day::parse("2026-02-29"), None);
    }
}
