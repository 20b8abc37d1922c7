//! Validation of identifiers and the text form of lease ids, against section 1 of the lease
//! contract.
//!
//! Pure string inspection: no allocation beyond the error message, no normalisation (an
//! identifier with surrounding whitespace is rejected, never silently trimmed, so two spellings
//! never name one resource).
//!
//! Must not depend on: the state machine (it sits below it, beside `ids`, `error` and `limits`).

use std::str::FromStr;

use crate::error::LeaseError;
use crate::ids::{GroupId, LeaseId, ResourceKey};
use crate::limits::{
    HOLDER_ID_BYTES_MAX, REQUEST_ID_BYTES_MAX, RESOURCE_ID_BYTES_MAX, TENANT_ID_BYTES_MAX,
};

impl ResourceKey {
    /// Checks both parts against section 1 of the contract.
    pub fn validate(&self) -> Result<(), LeaseError> {
        validate_tenant_id(&self.tenant_id)?;
        validate_resource_id(&self.resource_id)
    }
}

impl FromStr for LeaseId {
    type Err = LeaseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid =
            || LeaseError::invalid("lease_id", "expected the form gggggggg-ssssssssssssssss");
        let (group, sequence) = text.split_once('-').ok_or_else(invalid)?;
        let hex = |part: &str| part.bytes().all(|b| b.is_ascii_hexdigit());
        if group.len() != 8 || sequence.len() != 16 || !hex(group) || !hex(sequence) {
            return Err(invalid());
        }
        let group = u32::from_str_radix(group, 16).map_err(|_| invalid())?;
        let sequence = u64::from_str_radix(sequence, 16).map_err(|_| invalid())?;
        Ok(LeaseId {
            group_id: GroupId(group),
            sequence,
        })
    }
}

fn check_identifier(field: &'static str, value: &str, bytes_max: usize) -> Result<(), LeaseError> {
    if value.is_empty() {
        return Err(LeaseError::invalid(field, "must not be empty"));
    }
    if value.len() > bytes_max {
        return Err(LeaseError::invalid(
            field,
            format!("is {} bytes, at most {bytes_max} allowed", value.len()),
        ));
    }
    if value.trim() != value {
        return Err(LeaseError::invalid(
            field,
            "must not start or end with whitespace",
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(LeaseError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Checks a tenant id: non-empty, trimmed, no control characters, at most
/// [`TENANT_ID_BYTES_MAX`] bytes.
pub fn validate_tenant_id(tenant_id: &str) -> Result<(), LeaseError> {
    check_identifier("tenant_id", tenant_id, TENANT_ID_BYTES_MAX)
}

/// Checks a resource id: non-empty, trimmed, no control characters, at most
/// [`RESOURCE_ID_BYTES_MAX`] bytes.
pub fn validate_resource_id(resource_id: &str) -> Result<(), LeaseError> {
    check_identifier("resource_id", resource_id, RESOURCE_ID_BYTES_MAX)
}

/// Checks a holder id: non-empty, trimmed, no control characters, at most
/// [`HOLDER_ID_BYTES_MAX`] bytes.
pub fn validate_holder_id(holder_id: &str) -> Result<(), LeaseError> {
    check_identifier("holder_id", holder_id, HOLDER_ID_BYTES_MAX)
}

/// Checks a request id: non-empty, trimmed, no control characters, at most
/// [`REQUEST_ID_BYTES_MAX`] bytes.
pub fn validate_request_id(request_id: &str) -> Result<(), LeaseError> {
    check_identifier("request_id", request_id, REQUEST_ID_BYTES_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_id_text_form_round_trips() {
        let id = LeaseId {
            group_id: GroupId(42),
            sequence: 0xdead_beef,
        };
        let text = id.to_string();
        assert_eq!(text, "0000002a-00000000deadbeef");
        assert_eq!(text.parse::<LeaseId>().unwrap(), id);
    }

    #[test]
    fn malformed_lease_ids_are_invalid_arguments() {
        for text in [
            "",
            "1-2",
            "0000002a_00000000deadbeef",
            "0000002a-00000000deadbeeg",
            "+000002a-00000000deadbeef",
        ] {
            let err = text.parse::<LeaseId>().unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument, "{text}");
        }
    }

    #[test]
    fn identifiers_are_checked_for_emptiness_length_whitespace_and_control_characters() {
        assert!(validate_tenant_id("acme").is_ok());
        assert!(validate_tenant_id("").is_err());
        assert!(validate_tenant_id(" acme").is_err());
        assert!(validate_tenant_id("acme\n").is_err());
        assert!(validate_tenant_id("ac\u{0}me").is_err());
        assert!(validate_tenant_id(&"t".repeat(64)).is_ok());
        assert!(validate_tenant_id(&"t".repeat(65)).is_err());
        assert!(validate_resource_id(&"r".repeat(256)).is_ok());
        assert!(validate_resource_id(&"r".repeat(257)).is_err());
        assert!(validate_holder_id(&"h".repeat(128)).is_ok());
        assert!(validate_holder_id(&"h".repeat(129)).is_err());
        // Multi-byte characters count in bytes, not characters.
        assert!(validate_tenant_id(&"é".repeat(32)).is_ok());
        assert!(validate_tenant_id(&"é".repeat(33)).is_err());
    }
}
