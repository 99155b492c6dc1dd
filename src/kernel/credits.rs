//! Credits, the unit prices and credit limits are written in, and the integer micro-credits they
//! are stored and counted in. Quotas count them, models price in them, the logs report them.

/// Micro-credits in one credit: prices and credit limits are stored as integers.
pub const MICROS_PER_CREDIT: f64 = 1_000_000.0;

/// The most credits a price or a limit may name: credits are stored as integer micro-credits
/// in 64 bits (`i64::MAX` is 9,223,372,036,854.775807 credits), whole credits kept.
pub const MAX_STORED_CREDITS: f64 = 9_223_372_036_854.0;
/// [`MAX_STORED_CREDITS`] as people read it.
pub const MAX_STORED_CREDITS_TEXT: &str = "9,223,372,036,854";

/// Credits (as written by people) to integer micro-credits. The whole credits and the fraction
/// are converted apart: one product in `f64` would be off by hundreds of micro-credits near the
/// largest amounts stored ([`MAX_STORED_CREDITS`]); this keeps every whole number of credits
/// exact. Beyond `i64` it saturates (validation refuses such amounts first).
pub fn credits_to_micros(credits: f64) -> i64 {
    let whole = credits.trunc();
    let fraction = ((credits - whole) * MICROS_PER_CREDIT).round() as i64;
    (whole as i64).saturating_mul(1_000_000).saturating_add(fraction)
}

/// Integer micro-credits to credits, for people.
pub fn micros_to_credits(micros: i64) -> f64 {
    micros as f64 / MICROS_PER_CREDIT
}
