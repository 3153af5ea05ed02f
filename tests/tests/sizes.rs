//! Size limits of `lanes-core` (docs/ARCHITECTURE.md, Layout): no function longer than 80 lines,
//! no file longer than 500 lines before its tests. The ones still over are listed with their size
//! today, as ceilings: a listed one may only shrink, and leaves the list once it is within the limit
//! (the test says so); anything else over the limit fails. Run with `--nocapture` to see the ten
//! longest of each; `LANES_SIZES_SRC` measures another tree (an older checkout, for a
//! before-and-after).

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FN_LINES: usize = 80;
const MAX_FILE_LINES: usize = 500;

/// Functions still over the limit, with the size they may not exceed: none now, and a new one
/// over 80 lines fails the test.
const LONG_FUNCTIONS: [(&str, usize); 0] = [];

/// Files still over the limit before their tests, with the size they may not exceed: none now, and
/// a file that grows past 500 lines fails the test.
const LARGE_FILES: [(&str, usize); 0] = [];

/// What breaks the limit `max` or the ceilings `listed`.
fn breaches(measured: &[(usize, String)], max: usize, listed: &[(&str, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    for (n, name) in measured {
        match listed.iter().find(|(l, _)| l == name) {
            None if *n > max => out.push(format!("{name}: {n} lines, over {max}")),
            Some((_, ceiling)) if n > ceiling => {
                out.push(format!("{name}: {n} lines, over its ceiling {ceiling}"))
            }
            Some(_) if *n <= max => {
                out.push(format!("{name}: {n} lines, within {max}: take it off the list"))
            }
            _ => {}
        }
    }
    for (name, _) in listed {
        if !measured.iter().any(|(_, m)| m == name) {
            out.push(format!("{name}: listed but gone: take it off the list"));
        }
    }
    out
}

fn src() -> PathBuf {
    std::env::var("LANES_SIZES_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|_| lanes_tests::workspace_root().join("shared/src"))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string().trim() == "test")
    })
}

/// Every function outside tests, with its length in lines (signature to closing brace).
#[derive(Default)]
struct Functions {
    within: Vec<String>,
    found: Vec<(usize, String)>,
}

impl Functions {
    fn note(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let lines = span.end().line - span.start().line + 1;
        let mut path = self.within.clone();
        path.push(name.to_string());
        self.found.push((lines, path.join("::")));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_only(&i.attrs) {
            return;
        }
        let ty = &i.self_ty;
        self.within.push(quote_type(ty));
        syn::visit::visit_item_impl(self, i);
        self.within.pop();
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            self.note(&f.sig.ident, f.span());
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.note(&f.sig.ident, f.span());
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}

fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
        _ => "_".into(),
    }
}

/// Lines of a file before its first `#[cfg(test)]` item.
fn lines_before_tests(text: &str) -> usize {
    let file = syn::parse_file(text).unwrap();
    let first_test =
        file.items.iter().find(|i| matches!(i, syn::Item::Mod(m) if is_test_only(&m.attrs))).map(|i| {
            let attr_line = match i {
                syn::Item::Mod(m) => m.attrs.first().map_or(i.span().start().line, |a| a.span().start().line),
                _ => i.span().start().line,
            };
            attr_line - 1
        });
    first_test.unwrap_or_else(|| text.lines().count())
}

struct Measure {
    functions: Vec<(usize, String)>,
    files: Vec<(usize, String)>,
}

fn measure(src: &Path) -> Measure {
    let mut paths = Vec::new();
    files(src, &mut paths);
    let (mut functions, mut sizes) = (Vec::new(), Vec::new());
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let rel = path.strip_prefix(src).unwrap().display().to_string();
        let mut f = Functions::default();
        f.visit_file(&syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}")));
        functions.extend(f.found.into_iter().map(|(n, name)| (n, format!("{rel}::{name}"))));
        sizes.push((lines_before_tests(&text), rel));
    }
    functions.sort_by(|a, b| b.cmp(a));
    sizes.sort_by(|a, b| b.cmp(a));
    Measure { functions, files: sizes }
}

#[test]
fn functions_and_files_stay_within_their_limits() {
    let m = measure(&src());
    println!("longest functions:");
    for (n, name) in m.functions.iter().take(10) {
        println!("  {n:>4}  {name}");
    }
    println!("largest files before their tests:");
    for (n, name) in m.files.iter().take(10) {
        println!("  {n:>4}  {name}");
    }
    if std::env::var_os("LANES_SIZES_SRC").is_some() {
        return; // another tree: measured, not judged
    }
    let mut wrong = breaches(&m.functions, MAX_FN_LINES, &LONG_FUNCTIONS);
    wrong.extend(breaches(&m.files, MAX_FILE_LINES, &LARGE_FILES));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The measure on a file made for it, so the limit cannot pass on a parser that sees nothing.
#[test]
fn the_measure_counts_lines_and_skips_tests() {
    let dir = tempfile::tempdir().unwrap();
    let body = "    let x = 1;\n".repeat(90);
    let text = format!(
        "fn long() {{\n{body}}}\nimpl S {{\n    fn short(&self) {{}}\n}}\n#[cfg(test)]\nmod tests {{\n    fn hidden() {{\n{body}}}\n}}\n"
    );
    std::fs::write(dir.path().join("a.rs"), &text).unwrap();
    let m = measure(dir.path());
    assert_eq!(m.functions, [(92, "a.rs::long".to_owned()), (1, "a.rs::S::short".to_owned())]);
    assert_eq!(m.files, [(95, "a.rs".to_owned())]);
    assert_eq!(breaches(&m.functions, 80, &[]), ["a.rs::long: 92 lines, over 80"]);
    assert_eq!(breaches(&m.functions, 80, &[("a.rs::long", 92)]), Vec::<String>::new());
    assert_eq!(
        breaches(&m.functions, 80, &[("a.rs::long", 91)]),
        ["a.rs::long: 92 lines, over its ceiling 91"]
    );
    assert_eq!(
        breaches(&m.functions, 100, &[("a.rs::long", 92)]),
        ["a.rs::long: 92 lines, within 100: take it off the list"]
    );
}
