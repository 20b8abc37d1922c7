//! Identifiers: groups, resources and lease ids, as values (their validation and parsing is in
//! `validate`).
//!
//! Must not depend on: any other module of this crate (errors and limits build on these types).

use std::fmt;

use serde::{Deserialize, Serialize};

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
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant_id, self.resource_id)
    }
}

/// Identifier of a session: 128 bits its client draws at random when it opens the session, so a
/// retried open names the same session and no two clients pick the same id in practice. Scoped
/// to its tenant: a group keys session records by `(tenant, session_id)`. Its text form is 32
/// lower-case hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u128);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for SessionId {
    type Err = SessionIdParseError;

    /// Parses the text form (exactly 32 hex digits, either case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SessionIdParseError);
        }
        u128::from_str_radix(text, 16)
            .map(SessionId)
            .map_err(|_| SessionIdParseError)
    }
}

/// A session id's text form was not 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionIdParseError;

impl fmt::Display for SessionIdParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a session id is 32 hex digits")
    }
}

impl std::error::Error for SessionIdParseError {}
