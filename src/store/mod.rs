//! Storage tiers.

pub mod memory;
pub mod redis;
