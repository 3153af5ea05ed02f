//! Dependency hygiene, checked on the locked dependency graph (`cargo metadata --locked`):
//! - the declared `rust-version` is true: no locked dependency needs a newer compiler, the code's
//!   own let-chains need 1.88, and the toolchain here is at least as new (only one toolchain can be
//!   installed on the build machines, so the floor is checked from what the dependencies declare,
//!   and clippy's `incompatible_msrv` lint checks the standard library calls against it);
//! - one HTTP stack: a single `hyper` and a single `rustls` (the SDKs' legacy client is off);
//! - no deprecated crate (`serde_yaml`).

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::workspace_root;
use std::collections::BTreeMap;

fn version(v: &str) -> (u64, u64, u64) {
    let mut it = v.split('.').map(|p| p.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap_or(0), it.next().unwrap_or(0))
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // This machine's platform only: another platform's dependencies (Windows, UEFI) need not even
    // be downloaded.
    let rustc = std::process::Command::new("rustc").arg("-vV").output().unwrap();
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .unwrap();
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", &host])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_declared_rust_version_is_true_and_the_graph_is_clean() {
    let m = metadata();
    let members: Vec<&str> =
        m["workspace_members"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let mut declared = None;
    let mut needed = ((1, 88, 0), "let-chains in the workspace's own code".to_owned());
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in m["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap().to_owned();
        let rust = p["rust_version"].as_str().map(version);
        if members.contains(&p["id"].as_str().unwrap()) {
            let rust = rust.unwrap_or_else(|| panic!("{name} declares no rust-version"));
            assert!(declared.is_none_or(|d| d == rust), "members disagree on rust-version");
            declared = Some(rust);
        } else if let Some(rust) = rust
            && rust > needed.0
        {
            needed = (rust, format!("{name} {}", p["version"].as_str().unwrap()));
        }
        versions.entry(name).or_default().push(p["version"].as_str().unwrap().to_owned());
    }
    let declared = declared.unwrap();
    assert!(
        declared >= needed.0,
        "rust-version {declared:?} is below what {} needs: {:?}",
        needed.1,
        needed.0
    );
    let rustc = std::process::Command::new("rustc").arg("--version").output().unwrap();
    let rustc = String::from_utf8_lossy(&rustc.stdout);
    let here = version(rustc.split_whitespace().nth(1).unwrap().split('-').next().unwrap());
    assert!(here >= declared, "the toolchain here ({here:?}) is older than rust-version {declared:?}");

    for single in ["hyper", "rustls", "h2", "http"] {
        let v = versions.get(single).cloned().unwrap_or_default();
        assert!(v.len() <= 1, "{single} comes in several versions: {v:?}");
    }
    assert!(
        !versions.contains_key("serde_yaml"),
        "serde_yaml is deprecated (serde_norway is its maintained fork)"
    );
}
