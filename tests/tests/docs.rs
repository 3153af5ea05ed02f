//! The docs' claims that code can check, checked against the code:
//! - every module of `lanes-core` is in `lib.rs`'s `# Layout` and in docs/ARCHITECTURE.md's
//!   Layout, and every module either names exists;
//! - every environment variable the code reads (outside tests) is in the README's table of
//!   variables, which says its default or that it is required or optional, and every variable the
//!   table names is read;
//! - every problem type the routers answer with is in the README's list, and every listed one is
//!   answered somewhere.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::workspace_root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace_root().join(rel)).unwrap()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source of every file the products are built from: `lanes-core`, the functions, the CLI.
fn product_sources() -> Vec<(PathBuf, syn::File)> {
    let root = workspace_root();
    let mut paths = Vec::new();
    for dir in ["shared/src", "functions", "cli/src"] {
        rust_files(&root.join(dir), &mut paths);
    }
    paths
        .into_iter()
        .map(|p| {
            let file = syn::parse_file(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, file)
        })
        .collect()
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string().trim() == "test")
    })
}

/// Every string literal outside test items, macro bodies included.
#[derive(Default)]
struct Strings(Vec<String>);

impl Strings {
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        for t in tokens {
            match t {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Literal(l) => {
                    if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                        self.0.push(s.value());
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Strings {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
        self.0.push(s.value());
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
    }
}

const LANES: [&str; 3] = ["INTERACTIVE", "SYNTHESIS", "COMMITS"];

/// The names a table cell gives, with `<LANE>` spelled out.
fn names_in(cell: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in cell.split('`').skip(1).step_by(2) {
        let is_name = part.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "_<>".contains(c));
        if !is_name || part.is_empty() {
            continue;
        }
        match part.strip_suffix("<LANE>") {
            Some(prefix) => out.extend(LANES.map(|l| format!("{prefix}{l}"))),
            None => out.push(part.to_owned()),
        }
    }
    out
}

#[test]
fn every_variable_the_code_reads_is_in_the_readme_table_and_every_one_there_is_read() {
    let readme = read("README.md");
    let section = readme.split("## Lambda functions and their environment").nth(1).unwrap();
    let mut table = BTreeSet::new();
    let mut undescribed = Vec::new();
    for row in section.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let meaning = cells.last().unwrap().to_ascii_lowercase();
        if !["default", "required", "optional", "unset"].iter().any(|w| meaning.contains(w)) {
            undescribed.push(cells[0].trim_start_matches("| ").to_owned());
        }
        table.extend(names_in(cells[0]));
    }
    assert!(
        undescribed.is_empty(),
        "rows that give no default and say neither required nor optional: {undescribed:?}"
    );
    let mut read_by_code = BTreeSet::new();
    for (_, file) in product_sources() {
        let mut strings = Strings::default();
        strings.visit_file(&file);
        read_by_code.extend(strings.0.into_iter().filter(|s| {
            s.starts_with("LANES_")
                && s.len() > "LANES_".len()
                && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !s.ends_with('_')
        }));
    }
    let missing: Vec<&String> = read_by_code.iter().filter(|v| !table.contains(*v)).collect();
    let stale: Vec<&String> =
        table.iter().filter(|v| v.starts_with("LANES_") && !read_by_code.contains(*v)).collect();
    assert!(missing.is_empty(), "read by the code, not in the README's table: {missing:?}");
    assert!(stale.is_empty(), "in the README's table, read by no code: {stale:?}");
}

/// The slug of every `Problem::new(status, "slug", ..)` outside tests (`Self::new` in `problem.rs`).
#[derive(Default)]
struct Slugs {
    found: BTreeSet<String>,
    dynamic: Vec<String>,
    in_problem_rs: bool,
}

impl<'ast> Visit<'ast> for Slugs {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*call.func {
            let segments: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
            let is_new = segments.ends_with(&["Problem".into(), "new".into()])
                || (self.in_problem_rs && segments == ["Self", "new"]);
            if is_new {
                match call.args.iter().nth(1) {
                    Some(syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) => {
                        self.found.insert(s.value());
                    }
                    _ => self.dynamic.push(segments.join("::")),
                }
            }
        }
        syn::visit::visit_expr_call(self, call);
    }
}

#[test]
fn every_problem_type_answered_is_listed_and_every_listed_one_is_answered() {
    let mut slugs = Slugs::default();
    for (path, file) in product_sources() {
        slugs.in_problem_rs = path.ends_with("problem.rs");
        slugs.visit_file(&file);
    }
    assert!(
        slugs.dynamic.is_empty(),
        "a problem type that is not a literal slug: {} calls",
        slugs.dynamic.len()
    );
    let readme = read("README.md");
    let list = readme.split("`/problems/<slug>`").nth(1).unwrap();
    let list = &list[..list.find("\n\n").unwrap()];
    let listed: BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = slugs.found.difference(&listed).collect();
    let stale: Vec<&String> = listed.difference(&slugs.found).collect();
    assert!(missing.is_empty(), "answered, not in the README's list: {missing:?}");
    assert!(stale.is_empty(), "in the README's list, answered by no code: {stale:?}");
    assert!(slugs.found.len() >= 10, "the walk found only {:?}", slugs.found);
}

/// The top-level modules `lib.rs` declares.
fn declared_modules() -> BTreeSet<String> {
    let lib = syn::parse_file(&read("shared/src/lib.rs")).unwrap();
    lib.items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn every_module_is_in_both_layouts_and_every_module_they_name_exists() {
    let declared = declared_modules();
    let lib = read("shared/src/lib.rs");
    let layout: String = lib
        .lines()
        .skip_while(|l| *l != "//! # Layout")
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let in_lib: BTreeSet<String> = layout
        .split("[`")
        .skip(1)
        .filter_map(|s| s.split_once("`]").map(|(name, _)| name.to_owned()))
        .filter(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    let arch = read("docs/ARCHITECTURE.md");
    let section = arch.split("\n## Layout\n").nth(1).unwrap();
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let in_arch: BTreeSet<String> = section
        .split("src/")
        .skip(1)
        .filter_map(|s| {
            let name: String = s.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            (!name.is_empty() && s[name.len()..].starts_with(['/', '.'])).then_some(name)
        })
        .filter(|n| n != "lib")
        .collect();
    for (doc, named) in [("lib.rs's # Layout", &in_lib), ("ARCHITECTURE's Layout", &in_arch)] {
        let missing: Vec<&String> = declared.difference(named).collect();
        let unknown: Vec<&String> = named.difference(&declared).collect();
        assert!(missing.is_empty(), "modules {doc} does not list: {missing:?}");
        assert!(unknown.is_empty(), "{doc} lists modules that do not exist: {unknown:?}");
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(workspace_root().join("shared/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let stem = p.file_stem()?.to_string_lossy().into_owned();
            (p.is_dir() || p.extension().is_some_and(|e| e == "rs")).then_some(stem)
        })
        .filter(|n| n != "lib")
        .collect();
    assert_eq!(on_disk, declared, "files under shared/src and the modules lib.rs declares");
}

/// The walkers on inputs made for them, so a check cannot pass by seeing nothing.
#[test]
fn the_walkers_see_strings_in_macros_and_skip_tests() {
    let file = syn::parse_file(
        r#"fn a() { std::env::var("LANES_A"); format!("{}", "LANES_B"); Problem::new(S, "x-y", "", ""); }
           #[cfg(test)] mod tests { fn t() { let _ = "LANES_C"; Problem::new(S, "z", "", ""); } }"#,
    )
    .unwrap();
    let mut strings = Strings::default();
    strings.visit_file(&file);
    assert!(strings.0.contains(&"LANES_A".to_owned()) && strings.0.contains(&"LANES_B".to_owned()));
    assert!(!strings.0.contains(&"LANES_C".to_owned()));
    let mut slugs = Slugs::default();
    slugs.visit_file(&file);
    assert_eq!(slugs.found, BTreeSet::from(["x-y".to_owned()]));
    assert_eq!(
        names_in("`LANES_Q_<LANE>`, `REDIS_URL`"),
        ["LANES_Q_INTERACTIVE", "LANES_Q_SYNTHESIS", "LANES_Q_COMMITS", "REDIS_URL"]
    );
}
