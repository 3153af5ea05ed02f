//! In-memory event source mappings: the twin of the Lambda adapter, for tests and local runs.

use crate::ports::{ControlError, MappingControl};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// In-memory mappings, for tests and local runs.
#[derive(Debug, Default, Clone)]
pub struct MemoryMappings {
    values: Arc<Mutex<HashMap<String, Option<u32>>>>,
    updates: Arc<Mutex<u64>>,
}

impl MemoryMappings {
    /// Mappings with the given current values.
    pub fn new(initial: &[(&str, Option<u32>)]) -> Self {
        let values = initial.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        Self { values: Arc::new(Mutex::new(values)), updates: Arc::default() }
    }

    /// Updates made so far.
    pub fn updates(&self) -> u64 {
        self.updates.lock().map(|u| *u).unwrap_or(0)
    }
}

#[async_trait]
impl MappingControl for MemoryMappings {
    async fn max_concurrency(&self, mapping: &str) -> Result<Option<u32>, ControlError> {
        let values = self.values.lock().map_err(|e| ControlError::Unavailable(e.to_string()))?;
        values.get(mapping).copied().ok_or_else(|| ControlError::Refused(format!("no mapping {mapping}")))
    }

    async fn set_max_concurrency(&self, mapping: &str, value: u32) -> Result<(), ControlError> {
        let mut values = self.values.lock().map_err(|e| ControlError::Unavailable(e.to_string()))?;
        let slot =
            values.get_mut(mapping).ok_or_else(|| ControlError::Refused(format!("no mapping {mapping}")))?;
        *slot = Some(value);
        if let Ok(mut u) = self.updates.lock() {
            *u += 1;
        }
        Ok(())
    }
}
