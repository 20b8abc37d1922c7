//! TTLs over HTTP: `ttl_seconds` (Tenure v1) or `ttl_ms`, checked and converted; expiry times.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

/// The ttl in milliseconds from exactly one of `ttl_seconds` and `ttl_ms`.
pub(super) fn ttl_from_json(
    ttl_seconds: Option<&serde_json::Number>,
    ttl_ms: Option<u64>,
) -> Result<u64, ApiError> {
    match (ttl_seconds, ttl_ms) {
        (Some(_), Some(_)) => Err(invalid(
            "give exactly one of ttl_seconds and ttl_ms, not both",
        )),
        (None, None) => Err(invalid("ttl_seconds (or ttl_ms) is required")),
        (None, Some(ms)) => Ok(ms),
        (Some(seconds), None) => seconds_to_ms(seconds),
    }
}

/// Converts a JSON number of seconds to milliseconds exactly.
pub(super) fn seconds_to_ms(seconds: &serde_json::Number) -> Result<u64, ApiError> {
    let too_large = || invalid(format!("ttl_seconds {seconds} is too large"));
    if let Some(whole) = seconds.as_u64() {
        return whole.checked_mul(1_000).ok_or_else(too_large);
    }
    let value = seconds.as_f64().unwrap_or(f64::NAN);
    if !value.is_finite() || value < 0.0 || seconds.is_i64() {
        return Err(invalid(format!(
            "ttl_seconds must be a non-negative number, not {seconds}"
        )));
    }
    if value == 0.0 {
        return Ok(0);
    }
    decimal_seconds_to_ms(&seconds.to_string()).ok_or_else(|| {
        invalid(format!(
            "ttl_seconds {seconds} is not a whole number of milliseconds or is too large \
             (ttls are never rounded; use ttl_ms)"
        ))
    })
}

/// `text` (`digits[.digits][e[+-]digits]`) times 1000, if that is an integer that fits a u64.
pub(super) fn decimal_seconds_to_ms(text: &str) -> Option<u64> {
    let (mantissa_text, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() > 38 {
        return None;
    }
    let mut mantissa: u128 = digits.parse().ok()?;
    let mut scale = exponent
        .checked_add(3)?
        .checked_sub(i64::try_from(fraction.len()).ok()?)?;
    while scale < 0 && mantissa % 10 == 0 {
        mantissa /= 10;
        scale += 1;
    }
    if scale < 0 {
        return None;
    }
    for _ in 0..scale {
        mantissa = mantissa.checked_mul(10)?;
        if mantissa > u128::from(u64::MAX) {
            return None;
        }
    }
    u64::try_from(mantissa).ok()
}

pub(super) fn parse_lease_id(text: &str) -> Result<LeaseId, ApiError> {
    LeaseId::from_str(text).map_err(|error| ApiError::from(WireError::from_lease_error(error)))
}

pub(super) fn parse_status_filter(text: Option<&str>) -> Result<Option<LeaseStatus>, ApiError> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    if text.eq_ignore_ascii_case("ANY") {
        return Ok(None);
    }
    [
        LeaseStatus::Active,
        LeaseStatus::Expired,
        LeaseStatus::Released,
    ]
    .into_iter()
    .find(|status| status.as_str().eq_ignore_ascii_case(text))
    .map(Some)
    .ok_or_else(|| {
        invalid(format!(
            "filter_status must be ANY, ACTIVE, EXPIRED or RELEASED, not {text:?}"
        ))
    })
}
