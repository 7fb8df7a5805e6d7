//! The rate card (`hutch serve --rate-card FILE`): prices per unit of usage, in
//! micro-units of whatever currency the operator bills in, that turn [`UsageTotals`] into
//! `cost_micros`. Spending caps count cost through it, or CPU-seconds when the server has
//! none ([`BudgetUnit`]).
//!
//! ```json
//! {"cpu_second_micros": 12, "memory_gib_second_micros": 1.5,
//!  "disk_gib_hour_micros": 140, "egress_gib_micros": 90000}
//! ```
//!
//! Every price may be fractional and defaults to 0; unknown fields are refused.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{UsageTotals, GIB};
use crate::error::{CoreError, CoreResult};

/// Prices of one unit of each kind of usage, in micro-units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateCard {
    /// One second of one CPU.
    pub cpu_second_micros: f64,
    /// One GiB of working-set memory held for one second.
    pub memory_gib_second_micros: f64,
    /// One GiB of disk held for one hour.
    pub disk_gib_hour_micros: f64,
    /// One GiB sent out.
    pub egress_gib_micros: f64,
}

impl RateCard {
    /// Read and check a rate card file.
    pub fn load(path: &Path) -> CoreResult<Self> {
        let text = std::fs::read_to_string(path).map_err(CoreError::io("read", path))?;
        Self::parse(&text)
            .map_err(|e| CoreError::InvalidArgument(format!("rate card {}: {e}", path.display())))
    }

    /// Parse and check a rate card.
    pub fn parse(text: &str) -> Result<Self, String> {
        let card: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for (name, price) in [
            ("cpu_second_micros", card.cpu_second_micros),
            ("memory_gib_second_micros", card.memory_gib_second_micros),
            ("disk_gib_hour_micros", card.disk_gib_hour_micros),
            ("egress_gib_micros", card.egress_gib_micros),
        ] {
            if !price.is_finite() || price < 0.0 {
                return Err(format!("{name} must be a price of 0 or more, got {price}"));
            }
        }
        Ok(card)
    }

    /// What `usage` costs, in micro-units (rounded to the nearest).
    pub fn cost_micros(&self, usage: &UsageTotals) -> u64 {
        let cost = usage.cpu_seconds * self.cpu_second_micros
            + usage.memory_gib_seconds * self.memory_gib_second_micros
            + usage.disk_gib_hours * self.disk_gib_hour_micros
            + usage.egress_bytes as f64 / GIB * self.egress_gib_micros;
        cost.round().max(0.0) as u64
    }
}

/// What budgets (`daily_budget`, `monthly_budget`) count: cost through the rate card, or
/// CPU-seconds on a server without one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetUnit {
    /// Cost in micro-units.
    CostMicros(RateCard),
    /// CPU-seconds.
    CpuSeconds,
}

impl BudgetUnit {
    /// The server's unit.
    pub fn of(card: Option<&RateCard>) -> Self {
        card.map_or(Self::CpuSeconds, |c| Self::CostMicros(*c))
    }

    /// How much of a budget `usage` spends.
    pub fn spent(&self, usage: &UsageTotals) -> u64 {
        match self {
            Self::CostMicros(card) => card.cost_micros(usage),
            Self::CpuSeconds => usage.cpu_seconds.floor() as u64,
        }
    }

    /// The unit's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::CostMicros(_) => "cost micros",
            Self::CpuSeconds => "CPU-seconds",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_card_prices_each_kind_of_usage() {
        let card = RateCard::parse(
            r#"{"cpu_second_micros": 10, "memory_gib_second_micros": 2.5,
                "disk_gib_hour_micros": 100, "egress_gib_micros": 1000}"#,
        )
        .expect("valid");
        let usage = UsageTotals {
            cpu_seconds: 3.0,
            memory_gib_seconds: 4.0,
            disk_gib_hours: 0.5,
            egress_bytes: 1 << 29,
        };
        assert_eq!(card.cost_micros(&usage), 30 + 10 + 50 + 500);
        assert_eq!(BudgetUnit::of(None).spent(&usage), 3);
        assert_eq!(BudgetUnit::of(Some(&card)).spent(&usage), 590);
    }

    #[test]
    fn a_bad_rate_card_says_what_is_wrong() {
        assert!(RateCard::parse(r#"{"cpu_second": 1}"#)
            .expect_err("unknown field")
            .contains("unknown field `cpu_second`"));
        assert_eq!(
            RateCard::parse(r#"{"egress_gib_micros": -1}"#).expect_err("negative"),
            "egress_gib_micros must be a price of 0 or more, got -1"
        );
        assert_eq!(RateCard::parse("{}").expect("empty"), RateCard::default());
    }
}
