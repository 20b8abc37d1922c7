//! Identifiers: groups, resources, holders, request ids and lease ids, with their validation.
//!
//! Validation follows section 1 of the lease contract. It is pure string inspection: no
//! allocation beyond the error message, no normalisation (an identifier with surrounding
//! whitespace is rejected, never silently trimmed, so two spellings never name one resource).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::LeaseError;
use crate::limits::{
    HOLDER_ID_BYTES_MAX, REQUEST_ID_BYTES_MAX, RESOURCE_ID_BYTES_MAX, TENANT_ID_BYTES_MAX,
};

/// Identifier of one Raft group. Group ids are never reused within a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId(pub u32);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifier of one lease: the group that granted it and the sequence number it was granted
/// under, which is also the lease's fencing token.
///
/// Unique for the lifetime of the cluster because a group never issues a sequence number twice
/// (see the crate documentation) and group ids are never reused.
/// Its text form is `gggggggg-ssssssssssssssss` (group and sequence in lower-case hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId {
    /// The group whose state machine granted the lease.
    pub group_id: GroupId,
    /// The group-wide grant sequence number; equal to the lease's fencing token.
    pub sequence: u64,
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}-{:016x}", self.group_id.0, self.sequence)
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

/// A resource name: `(tenant_id, resource_id)`. Every resource belongs to exactly one group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResourceKey {
    /// The owning tenant.
    pub tenant_id: String,
    /// The resource's name inside the tenant.
    pub resource_id: String,
}

impl ResourceKey {
    /// Builds a key without validating it; [`ResourceKey::validate`] checks it.
    pub fn new(tenant_id: impl Into<String>, resource_id: impl Into<String>) -> Self {
        ResourceKey {
            tenant_id: tenant_id.into(),
            resource_id: resource_id.into(),
        }
    }

    /// Checks both parts against section 1 of the contract.
    pub fn validate(&self) -> Result<(), LeaseError> {
        validate_tenant_id(&self.tenant_id)?;
        validate_resource_id(&self.resource_id)
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant_id, self.resource_id)
    }
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
