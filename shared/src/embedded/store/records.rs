//! Where the embedded store keeps its task records: the tables, the order of their keys, and the
//! reading of a file written with the older layout.
//!
//! # Layout
//!
//! A task id is the sha256 of its payload, so ids arrive in random order. Keyed by id, each of a
//! task's writes (submitted, claimed, finished) lands on a random leaf of the B-tree, and a group
//! commit copies and writes one page per record it touched, plus the branches above them.
//! Records are keyed by `(created_at_ms, id)` instead. The records one group commit writes are
//! mostly the youngest, so they share a few leaves at the tree's right edge. A second table maps
//! each id to its `created_at_ms`. Its entries are small, many to a leaf. A submission inserts
//! into it once, and every later write only reads it.
//!
//! A record is always stored under its own `created_at_ms`: a replacement (an expired or failed
//! record submitted again) moves to its new place.
//!
//! A file written before this layout keeps its records in a table keyed by id (the legacy table).
//! They are read there, and each moves to the new layout when it is next written; the first sweep
//! moves the rest and drops the table.

use super::unavailable;
use crate::ports::StoreError;
use redb::{ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition, WriteTransaction};

/// The records by `(created_at_ms, id)`: JSON.
const RECORDS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("task_records");
/// Each record's `created_at_ms` by id: where in [`RECORDS`] it is.
const CREATED: TableDefinition<&str, u64> = TableDefinition::new("task_created");
/// The layout of a file written before this one: records by id.
const LEGACY: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");

/// Where a record was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In [`RECORDS`], created at this time.
    Created(u64),
    /// In the legacy table.
    Legacy,
}

/// A stored record: its bytes and where they are.
pub(super) struct Stored {
    pub(super) bytes: Vec<u8>,
    pub(super) place: Place,
}

/// The record tables, open in one write transaction.
pub(super) struct Records<'t> {
    created: Table<'t, &'static str, u64>,
    records: Table<'t, (u64, &'static str), &'static [u8]>,
    /// Opened only while the file may still hold legacy records: opening a table in a write
    /// transaction creates it.
    legacy: Option<Table<'t, &'static str, &'static [u8]>>,
}

impl<'t> Records<'t> {
    /// The tables in `txn`; the legacy table too when `legacy` (the file may still hold some).
    pub(super) fn open(txn: &'t WriteTransaction, legacy: bool) -> Result<Self, StoreError> {
        Ok(Self {
            created: txn.open_table(CREATED).map_err(unavailable)?,
            records: txn.open_table(RECORDS).map_err(unavailable)?,
            legacy: if legacy { Some(txn.open_table(LEGACY).map_err(unavailable)?) } else { None },
        })
    }

    /// `id`'s record, wherever it is.
    pub(super) fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        if let Some(created) = self.created.get(id).map_err(unavailable)? {
            let created = created.value();
            let bytes = self.records.get((created, id)).map_err(unavailable)?;
            return Ok(bytes.map(|b| Stored { bytes: b.value().to_vec(), place: Place::Created(created) }));
        }
        let Some(legacy) = &self.legacy else { return Ok(None) };
        let bytes = legacy.get(id).map_err(unavailable)?;
        Ok(bytes.map(|b| Stored { bytes: b.value().to_vec(), place: Place::Legacy }))
    }

    /// Writes `bytes` as `id`'s record, created at `created_ms`; `was` is where the record it
    /// replaces is, which it leaves.
    pub(super) fn put(
        &mut self,
        id: &str,
        created_ms: u64,
        bytes: &[u8],
        was: Option<Place>,
    ) -> Result<(), StoreError> {
        match was {
            Some(Place::Created(at)) if at == created_ms => {}
            Some(place) => {
                self.remove_at(id, place)?;
                self.created.insert(id, created_ms).map_err(unavailable)?;
            }
            None => {
                self.created.insert(id, created_ms).map_err(unavailable)?;
            }
        }
        self.records.insert((created_ms, id), bytes).map_err(unavailable)?;
        Ok(())
    }

    /// Removes the record stored at `place`.
    pub(super) fn remove_at(&mut self, id: &str, place: Place) -> Result<(), StoreError> {
        match place {
            Place::Created(at) => {
                self.records.remove((at, id)).map_err(unavailable)?;
                self.created.remove(id).map_err(unavailable)?;
            }
            Place::Legacy => {
                if let Some(legacy) = &mut self.legacy {
                    legacy.remove(id).map_err(unavailable)?;
                }
            }
        }
        Ok(())
    }

    /// Every record, each with its id, in no particular order.
    pub(super) fn each(
        &self,
        mut f: impl FnMut(&str, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for entry in self.records.iter().map_err(unavailable)? {
            let (k, v) = entry.map_err(unavailable)?;
            f(k.value().1, v.value())?;
        }
        if let Some(legacy) = &self.legacy {
            for entry in legacy.iter().map_err(unavailable)? {
                let (k, v) = entry.map_err(unavailable)?;
                f(k.value(), v.value())?;
            }
        }
        Ok(())
    }
}

/// Moves every legacy record to the new layout (under `created_at(bytes)`, 0 when its JSON says
/// none: kept, never dropped) and drops the legacy table.
pub(super) fn move_legacy(
    txn: &WriteTransaction,
    created_at: impl Fn(&[u8]) -> Option<u64>,
) -> Result<(), StoreError> {
    let rows: Vec<(String, Vec<u8>)> = {
        let legacy = txn.open_table(LEGACY).map_err(unavailable)?;
        let mut rows = Vec::new();
        for entry in legacy.iter().map_err(unavailable)? {
            let (k, v) = entry.map_err(unavailable)?;
            rows.push((k.value().to_owned(), v.value().to_vec()));
        }
        rows
    };
    let mut records = Records::open(txn, false)?;
    for (id, bytes) in &rows {
        records.put(id, created_at(bytes).unwrap_or(0), bytes, None)?;
    }
    drop(records);
    txn.delete_table(LEGACY).map_err(unavailable)?;
    Ok(())
}

/// Whether the file may hold legacy records (the table exists, or it cannot be told).
pub(super) fn has_legacy(db: &redb::Database) -> bool {
    let Ok(txn) = db.begin_read() else { return true };
    !matches!(txn.open_table(LEGACY), Err(redb::TableError::TableDoesNotExist(_)))
}

/// `id`'s record in a read transaction, wherever it is; `legacy` as in [`Records::open`].
pub(super) fn read(txn: &ReadTransaction, id: &str, legacy: bool) -> Result<Option<Vec<u8>>, StoreError> {
    match txn.open_table(CREATED) {
        Ok(created) => {
            if let Some(at) = created.get(id).map_err(unavailable)? {
                let records = txn.open_table(RECORDS).map_err(unavailable)?;
                return Ok(records.get((at.value(), id)).map_err(unavailable)?.map(|v| v.value().to_vec()));
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(unavailable(e)),
    }
    if !legacy {
        return Ok(None);
    }
    match txn.open_table(LEGACY) {
        Ok(t) => Ok(t.get(id).map_err(unavailable)?.map(|v| v.value().to_vec())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(unavailable(e)),
    }
}

/// Every record's bytes in a read transaction, in both layouts.
pub(super) fn read_all(txn: &ReadTransaction) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut out = Vec::new();
    values(txn, RECORDS, &mut out)?;
    values(txn, LEGACY, &mut out)?;
    Ok(out)
}

/// Appends every value of `table` (none if it does not exist) to `out`.
fn values<K: redb::Key + 'static>(
    txn: &ReadTransaction,
    table: TableDefinition<K, &'static [u8]>,
    out: &mut Vec<Vec<u8>>,
) -> Result<(), StoreError> {
    let table = match txn.open_table(table) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(unavailable(e)),
    };
    for entry in table.iter().map_err(unavailable)? {
        out.push(entry.map_err(unavailable)?.1.value().to_vec());
    }
    Ok(())
}

/// How many records and locators (ids in [`CREATED`]) the new layout holds.
#[cfg(test)]
pub(super) fn count(txn: &ReadTransaction) -> Result<(u64, u64), StoreError> {
    use redb::ReadableTableMetadata;
    let records = txn.open_table(RECORDS).map_err(unavailable)?.len().map_err(unavailable)?;
    let created = txn.open_table(CREATED).map_err(unavailable)?.len().map_err(unavailable)?;
    Ok((records, created))
}
