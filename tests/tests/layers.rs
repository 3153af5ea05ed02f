//! Layers point one way (docs/ARCHITECTURE.md, Dependency rule), checked on the source of
//! `lanes-core` at module granularity: at every level of the module tree, no child module (with
//! everything under it) refers to a sibling that refers back to it, directly or through others.
//!
//! A reference is any path the code names outside its tests: `use` items, paths in types and
//! expressions, and `crate::` paths inside macro calls and attributes. `crate::`, `super::` and `self::` paths are
//! resolved, and so are names a `use` brought in for a module (`use crate::tasks;` then
//! `tasks::worker::X`). A child naming its parent's items, or a parent its children's, is
//! containment, not a layer, and is not counted.
//! A cycle fails the test with the siblings it joins and the shortest loop through each of them,
//! every step with the file that makes it.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module of the crate by its path (`["tasks", "worker"]`); `[]` is the crate root.
type Module = Vec<String>;

fn name(m: &[String]) -> String {
    if m.is_empty() { "crate".into() } else { m.join("::") }
}

/// Every file module under `src`, by module path.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let mut p = prefix.clone();
                p.push(stem);
                walk(&path, &p, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let mut m = prefix.clone();
                if stem != "mod" && stem != "lib" {
                    m.push(stem);
                }
                out.insert(m, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &Vec::new(), &mut out);
    out
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string().trim() == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        Fn(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        Type(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// What one file refers to.
struct Refs<'a> {
    here: &'a Module,
    known: &'a BTreeMap<Module, PathBuf>,
    /// Names a `use` bound to a module of the crate.
    aliases: BTreeMap<String, Module>,
    out: BTreeSet<Module>,
}

impl Refs<'_> {
    /// The crate path `segments` stand for, if they start inside the crate.
    fn absolute(&self, segments: &[String]) -> Option<Module> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => {
                let mut b = self.here.clone();
                b.pop();
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    b.pop();
                    rest = &rest[1..];
                }
                b.extend(rest.iter().cloned());
                return Some(b);
            }
            other => {
                if let Some(m) = self.aliases.get(other) {
                    m.clone()
                } else {
                    let mut child = self.here.clone();
                    child.push(other.to_owned());
                    if !self.known.contains_key(&child) {
                        return None;
                    }
                    child
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module a crate path lands in: its longest prefix that is a module.
    fn module_of(&self, path: &[String]) -> Option<Module> {
        (0..=path.len()).rev().map(|k| path[..k].to_vec()).find(|m| self.known.contains_key(m))
    }

    fn refer(&mut self, segments: &[String]) {
        if let Some(m) = self.absolute(segments).and_then(|p| self.module_of(&p)) {
            self.out.insert(m);
        }
    }

    /// Every leaf of a `use` tree as a path, with the name it binds.
    fn use_leaves(
        tree: &syn::UseTree,
        prefix: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                Self::use_leaves(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if n.ident == "self" => out.push((prefix.clone(), prefix.last().cloned())),
            syn::UseTree::Name(n) => {
                let mut p = prefix.clone();
                p.push(n.ident.to_string());
                out.push((p, Some(n.ident.to_string())));
            }
            syn::UseTree::Rename(r) => {
                let mut p = prefix.clone();
                p.push(r.ident.to_string());
                out.push((p, Some(r.rename.to_string())));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    Self::use_leaves(t, prefix, out);
                }
            }
        }
    }

    /// `crate :: a :: b` sequences in a macro's tokens.
    fn scan(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.scan(g.stream()),
                TokenTree::Ident(id) if id == "crate" => {
                    let mut path = vec!["crate".to_owned()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(n.to_string());
                        j += 3;
                    }
                    self.refer(&path);
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        Self::use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for (path, _) in leaves {
            self.refer(&path);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && segments.len() > 1 {
            self.refer(&segments);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        // Derive helpers and attribute macros (`#[openapi(paths(...))]`) name code in their tokens.
        if let syn::Meta::List(l) = &a.meta {
            self.scan(l.tokens.clone());
        }
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// For each module, the modules it refers to (itself, its ancestors and descendants left out).
fn references(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let known = modules(src);
    let mut graph = BTreeMap::new();
    for (here, path) in &known {
        let file = syn::parse_file(&std::fs::read_to_string(path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut refs = Refs { here, known: &known, aliases: BTreeMap::new(), out: BTreeSet::new() };
        // Module names a `use` binds first, so paths through them resolve wherever they appear.
        for item in file.items.iter().filter(|i| !is_test_only(item_attrs(i))) {
            if let syn::Item::Use(u) = item {
                let mut leaves = Vec::new();
                Refs::use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
                for (path, bound) in leaves {
                    if let (Some(bound), Some(abs)) = (bound, refs.absolute(&path))
                        && known.contains_key(&abs)
                    {
                        refs.aliases.insert(bound, abs);
                    }
                }
            }
        }
        refs.visit_file(&file);
        let out: BTreeSet<Module> =
            refs.out.into_iter().filter(|m| !(m.starts_with(here) || here.starts_with(m))).collect();
        graph.insert(here.clone(), out);
    }
    graph
}

/// A cycle found among the children of `parent`: the siblings it joins, and the shortest loop
/// through each of them, with a file-level reference for each step.
#[derive(Debug)]
struct Cycle {
    parent: Module,
    members: Vec<String>,
    loops: Vec<Vec<String>>,
}

fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Cycle> {
    let mut parents: BTreeSet<Module> = BTreeSet::new();
    for m in graph.keys() {
        for k in 0..m.len() {
            parents.insert(m[..k].to_vec());
        }
    }
    let mut found = Vec::new();
    for parent in parents {
        let child = |m: &Module| {
            (m.len() > parent.len() && m.starts_with(&parent)).then(|| m[..=parent.len()].to_vec())
        };
        // Sibling -> sibling, with one file-level reference that makes the step.
        let mut steps: BTreeMap<Module, BTreeMap<Module, (Module, Module)>> = BTreeMap::new();
        for (a, targets) in graph {
            let Some(ca) = child(a) else { continue };
            for b in targets {
                if let Some(cb) = child(b).filter(|cb| *cb != ca) {
                    steps.entry(ca.clone()).or_default().entry(cb).or_insert((a.clone(), b.clone()));
                }
            }
        }
        for component in strongly_connected(&steps) {
            let members: Vec<String> = component.iter().map(|m| name(m)).collect();
            let mut loops: Vec<Vec<String>> = Vec::new();
            let mut seen: BTreeSet<BTreeSet<Module>> = BTreeSet::new();
            for start in &component {
                let round = one_loop(&steps, &component, start);
                if !seen.insert(round.iter().cloned().collect()) {
                    continue;
                }
                loops.push(
                    round
                        .windows(2)
                        .map(|w| {
                            let (a, b) = &steps[&w[0]][&w[1]];
                            format!("{} -> {} ({} names {})", name(&w[0]), name(&w[1]), name(a), name(b))
                        })
                        .collect(),
                );
            }
            found.push(Cycle { parent: parent.clone(), members, loops });
        }
    }
    found
}

/// Tarjan's strongly connected components with more than one member.
fn strongly_connected<V>(steps: &BTreeMap<Module, BTreeMap<Module, V>>) -> Vec<BTreeSet<Module>> {
    struct State<'a, V> {
        steps: &'a BTreeMap<Module, BTreeMap<Module, V>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        out: Vec<BTreeSet<Module>>,
    }
    fn visit<V>(s: &mut State<'_, V>, v: &Module) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        let next: Vec<Module> = s.steps.get(v).map(|t| t.keys().cloned().collect()).unwrap_or_default();
        for w in next {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            loop {
                let w = s.stack.pop().unwrap();
                let done = w == *v;
                component.insert(w);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s =
        State { steps, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for v in steps.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest loop from `start` back to it (breadth first, inside its component), as the
/// members it passes, first and last the same.
fn one_loop<V>(
    steps: &BTreeMap<Module, BTreeMap<Module, V>>,
    component: &BTreeSet<Module>,
    start: &Module,
) -> Vec<Module> {
    let start = start.clone();
    let mut came: BTreeMap<Module, Module> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(v) = queue.pop_front() {
        for w in steps.get(&v).into_iter().flat_map(|t| t.keys()).filter(|w| component.contains(*w)) {
            if *w == start {
                let mut path = vec![v.clone()];
                while let Some(p) = came.get(path.last().unwrap()) {
                    path.push(p.clone());
                }
                // The walk back ends at `start`, the one member reached without a step.
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !came.contains_key(w) {
                came.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    vec![start]
}

/// `lanes-core`'s source, or `LANES_LAYERS_SRC` (another checkout's, for a before-and-after).
fn src() -> PathBuf {
    std::env::var("LANES_LAYERS_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|_| lanes_tests::workspace_root().join("shared/src"))
}

#[test]
fn no_module_refers_to_one_that_refers_back() {
    let report: Vec<String> = cycles(&references(&src()))
        .iter()
        .map(|c| {
            let loops: Vec<String> = c.loops.iter().map(|l| l.join("; ")).collect();
            format!(
                "a cycle under {} joins {}:\n    {}",
                name(&c.parent),
                c.members.join(" "),
                loops.join("\n    ")
            )
        })
        .collect();
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The resolver on a tree made for it: it must see `use`, `super::`, aliases, inline paths and
/// macro paths, and ignore tests and containment, or the check above could pass on anything.
#[test]
fn the_resolver_sees_every_kind_of_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let files = [
        ("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e;"),
        ("a/mod.rs", "pub mod inner; pub use inner::X;"),
        ("a/inner.rs", "use crate::b; pub fn f() { b::g(); } pub struct X;"),
        (
            "b.rs",
            "#[utoipa::path(get, path = \"/\", responses((body = crate::d::T)))] pub fn g() { let _ = super::a::X; }",
        ),
        ("c.rs", "pub fn h() { tracing::info!(\"{}\", crate::d::V); }"),
        ("d.rs", "pub const V: u8 = 1; pub fn k() -> crate::c::T { todo!() } pub struct T;"),
        ("e.rs", "#[cfg(test)] mod tests { use crate::a::X; }"),
    ];
    for (f, text) in files {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let graph = references(dir);
    let m = |s: &str| s.split("::").map(str::to_owned).collect::<Module>();
    assert_eq!(graph[&m("a::inner")], BTreeSet::from([m("b")]));
    assert_eq!(graph[&m("b")], BTreeSet::from([m("a"), m("d")]));
    assert_eq!(graph[&m("c")], BTreeSet::from([m("d")]));
    assert!(graph[&m("e")].is_empty(), "test code is not a layer: {:?}", graph[&m("e")]);
    assert!(graph[&m("a")].is_empty(), "a parent naming its child is containment");
    let mut found: Vec<String> = cycles(&graph).iter().map(|c| c.members.join(" ")).collect();
    found.sort();
    assert_eq!(found, ["a b", "c d"]);
}

/// The functions that call the visibility methods, outside tests.
#[derive(Default)]
struct VisibilityCalls {
    within: Vec<String>,
    found: Vec<String>,
}

impl<'ast> Visit<'ast> for VisibilityCalls {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.within.push(f.sig.ident.to_string());
        syn::visit::visit_item_fn(self, f);
        self.within.pop();
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.within.push(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
        self.within.pop();
    }
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if call.method == "change_visibility" || call.method == "change_visibility_many" {
            self.found.push(format!("{} in {}", call.method, self.within.join("::")));
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// Outside the adapters, the twins and the port's own default, only `lease` changes a message's
/// visibility: the lease start, the heartbeat, the hand-back, the release of messages not started
/// and the hide of swept ones all go through it, so each rule about visibility is written there once.
#[test]
fn only_lease_changes_visibility() {
    let mut found = Vec::new();
    for (module, path) in modules(&src()) {
        let owner = module.first().map(String::as_str);
        if matches!(owner, Some("adapters" | "embedded" | "lease" | "ports")) {
            continue;
        }
        let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut calls = VisibilityCalls::default();
        calls.visit_file(&file);
        found.extend(calls.found.into_iter().map(|call| format!("{} ({call})", path.display())));
    }
    assert!(found.is_empty(), "visibility changed outside lease: {}", found.join(", "));
}

/// The bottom layers name nothing above them: `domain` and `ports` (vocabulary and traits),
/// `adapters` and `embedded` (a twin per port) never reach into a mechanism, a flow or the wiring.
#[test]
fn the_bottom_layers_name_nothing_above_them() {
    let bottom = ["domain", "ports", "adapters", "embedded"];
    let above = [
        "lease",
        "limiter",
        "llm",
        "pool",
        "quota",
        "running",
        "tasks",
        "commits",
        "dlq",
        "dlq_admin",
        "controller",
        "openapi",
        "wiring",
        "local",
        "summarize",
        "lambda",
    ];
    let mut wrong = Vec::new();
    for (module, refs) in references(&src()) {
        if !module.first().is_some_and(|m| bottom.contains(&m.as_str())) {
            continue;
        }
        for r in refs {
            if r.first().is_some_and(|m| above.contains(&m.as_str())) {
                wrong.push(format!("{} -> {}", name(&module), name(&r)));
            }
        }
    }
    assert!(wrong.is_empty(), "a bottom layer names one above it: {}", wrong.join(", "));
}
