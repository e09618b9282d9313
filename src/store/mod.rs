//! Storage tiers.

pub mod memory;
