//! The diff budget (see docs/ARCHITECTURE.md, LLM gateway): drop noise first (lockfiles, vendored, generated, minified, binary
//! files), then cut what is left to at most `max_tokens` (4,000) tokens counted by a real BPE
//! tokenizer (`o200k_base`), keeping every file header and the start of every hunk and marking what
//! was cut. A commit that only touches noise needs no model at all ([`Trimmed::noise_only`]).

use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;

/// Default per-commit diff budget, in tokens.
pub const DIFF_TOKENS: usize = 4_000;

fn bpe() -> &'static CoreBPE {
    static BPE: OnceLock<CoreBPE> = OnceLock::new();
    // The vocabulary is compiled into the binary: loading it cannot fail short of a corrupt build.
    BPE.get_or_init(|| tiktoken_rs::o200k_base().unwrap_or_else(|e| panic!("o200k_base vocabulary: {e}")))
}

/// Starts loading the vocabulary (about 0.1 s in release builds, more in debug) on its own thread,
/// once per process, so that a batch's counts rarely wait for it: a batch reads the cache, the store
/// and its diffs before counting anything, and a count made before the load is done waits for it.
/// The Lambda commits worker calls it as each batch starts: at init it would overlap no wait
/// (nothing there waits on the network) and only slow init down.
pub fn warm() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new().name("lanes-bpe".into()).spawn(|| {
            let _ = bpe();
        });
    });
}

/// Tokens of `text` under `o200k_base` (GPT-4o's encoding; within a few percent of other BPEs).
pub fn count_tokens(text: &str) -> usize {
    bpe().encode_ordinary(text).len()
}

/// Why a file's changes were left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noise {
    /// A dependency lockfile.
    Lockfile,
    /// Third-party code checked in.
    Vendored,
    /// Produced by a tool (marked, or by name).
    Generated,
    /// Minified (very long lines).
    Minified,
    /// Binary content.
    Binary,
}

impl Noise {
    fn as_str(self) -> &'static str {
        match self {
            Noise::Lockfile => "lockfile",
            Noise::Vendored => "vendored",
            Noise::Generated => "generated",
            Noise::Minified => "minified",
            Noise::Binary => "binary",
        }
    }
}

const LOCKFILES: &[&str] = &[
    "Cargo.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "bun.lock",
    "poetry.lock",
    "Pipfile.lock",
    "uv.lock",
    "pdm.lock",
    "Gemfile.lock",
    "composer.lock",
    "go.sum",
    "flake.lock",
    "mix.lock",
    "pubspec.lock",
    "Podfile.lock",
    "packages.lock.json",
    "gradle.lockfile",
    "Package.resolved",
];
const VENDOR_DIRS: &[&str] =
    &["vendor", "node_modules", "third_party", "third-party", "bower_components", "Pods"];
const GENERATED_SUFFIXES: &[&str] = &[
    ".min.js",
    ".min.css",
    ".js.map",
    ".css.map",
    ".pb.go",
    "_pb2.py",
    "_pb2_grpc.py",
    ".pb.cc",
    ".pb.h",
    ".g.dart",
    ".freezed.dart",
    ".snap",
    ".designer.cs",
];

/// Classifies a path by name alone.
pub fn noise_by_path(path: &str) -> Option<Noise> {
    let name = path.rsplit('/').next().unwrap_or(path);
    if LOCKFILES.contains(&name) {
        return Some(Noise::Lockfile);
    }
    if path.split('/').any(|c| VENDOR_DIRS.contains(&c)) {
        return Some(Noise::Vendored);
    }
    if GENERATED_SUFFIXES.iter().any(|s| name.ends_with(s))
        || name.contains(".generated.")
        || name.contains("_generated.")
        || path.split('/').any(|c| c == "__snapshots__")
    {
        return Some(Noise::Generated);
    }
    None
}

struct Hunk<'a> {
    head: &'a str,
    lines: Vec<&'a str>,
}

struct FileDiff<'a> {
    header: Vec<&'a str>,
    path: String,
    hunks: Vec<Hunk<'a>>,
    noise: Option<Noise>,
    added: usize,
    removed: usize,
}

/// A diff after the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trimmed {
    /// The text to send.
    pub text: String,
    /// Its tokens.
    pub tokens: usize,
    /// Whether anything was removed (noise or a cut).
    pub cut: bool,
    /// Paths of every file the diff touches.
    pub files: Vec<String>,
    /// Files left out as noise, with why.
    pub noise: Vec<(String, Noise)>,
    /// True when no file has substance left (only noise, or an empty diff): no model needed.
    pub noise_only: bool,
}

impl Trimmed {
    /// A sentence describing a noise-only commit, for the rule summary.
    pub fn rule_summary(&self) -> String {
        if self.noise.is_empty() {
            return "No file content changes (empty, mode-only or merge commit).".to_owned();
        }
        let mut kinds: Vec<&str> = self.noise.iter().map(|(_, n)| n.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let shown: Vec<&str> = self.noise.iter().take(5).map(|(p, _)| p.as_str()).collect();
        let more = self.noise.len().saturating_sub(shown.len());
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        format!("Only {} file changes: {}{more}.", kinds.join("/"), shown.join(", "))
    }
}

fn path_of(diff_line: &str) -> String {
    // `diff --git a/<old> b/<new>`: the new path is after the last " b/" (paths with " b/" inside are
    // rare; git quotes unusual names, which we keep as they are).
    let rest = diff_line.trim_start_matches("diff --git ");
    match rest.rfind(" b/") {
        Some(i) => rest[i + 3..].trim_matches('"').to_owned(),
        None => rest.to_owned(),
    }
}

fn parse(diff: &str) -> (Vec<&str>, Vec<FileDiff<'_>>) {
    let mut preamble = Vec::new();
    let mut files: Vec<FileDiff<'_>> = Vec::new();
    for line in diff.lines() {
        if line.starts_with("diff --git ") {
            files.push(FileDiff {
                header: vec![line],
                path: path_of(line),
                hunks: Vec::new(),
                noise: None,
                added: 0,
                removed: 0,
            });
            continue;
        }
        let Some(file) = files.last_mut() else {
            preamble.push(line);
            continue;
        };
        if line.starts_with("@@") {
            file.hunks.push(Hunk { head: line, lines: Vec::new() });
        } else if let Some(h) = file.hunks.last_mut() {
            if line.starts_with('+') {
                file.added += 1;
            } else if line.starts_with('-') {
                file.removed += 1;
            }
            h.lines.push(line);
        } else {
            file.header.push(line);
        }
    }
    for f in &mut files {
        f.noise = classify(f);
    }
    (preamble, files)
}

fn classify(f: &FileDiff<'_>) -> Option<Noise> {
    if f.header.iter().any(|l| l.starts_with("Binary files ") || l.starts_with("GIT binary patch")) {
        return Some(Noise::Binary);
    }
    if let Some(n) = noise_by_path(&f.path) {
        return Some(n);
    }
    // Marked generated: the usual markers in the first added lines.
    let added = || f.hunks.iter().flat_map(|h| h.lines.iter()).filter(|l| l.starts_with('+'));
    for l in added().take(10) {
        if l.contains("@generated") || l.contains("DO NOT EDIT") || l.contains("Code generated by") {
            return Some(Noise::Generated);
        }
    }
    // Minified: a very long line (already shortened, see `shorten_long_lines`) among the first added
    // lines, or long lines making up a tenth of all of them, wherever they are.
    let (mut lines, mut long) = (0usize, 0usize);
    for (i, l) in added().enumerate() {
        lines += 1;
        if l.ends_with(LONG_LINE_MARK_END) && l.contains(LONG_LINE_MARK) {
            if i < 10 {
                return Some(Noise::Minified);
            }
            long += 1;
        }
    }
    (long > 0 && long * 10 >= lines).then_some(Noise::Minified)
}

/// Lines longer than this (bytes) are shortened before anything is tokenized.
pub const LONG_LINE_BYTES: usize = 1_000;
/// What is kept of a long line.
const LONG_LINE_KEEP: usize = 160;
const LONG_LINE_MARK: &str = " [lanes: a ";
const LONG_LINE_MARK_END: &str = "-byte line cut]";

/// Shortens every line over [`LONG_LINE_BYTES`] to its start and a marker, wherever it is: a
/// minified bundle or an embedded blob says nothing a summary needs, and a multi-megabyte line
/// would cost its whole length to tokenize. Borrows when no line is long.
pub fn shorten_long_lines(diff: &str) -> std::borrow::Cow<'_, str> {
    if !diff.split('\n').any(|l| l.len() > LONG_LINE_BYTES) {
        return std::borrow::Cow::Borrowed(diff);
    }
    let mut out = String::with_capacity(diff.len().min(1 << 20));
    for (i, line) in diff.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.len() > LONG_LINE_BYTES {
            let mut keep = LONG_LINE_KEEP;
            while !line.is_char_boundary(keep) {
                keep -= 1;
            }
            out.push_str(&line[..keep]);
            out.push_str(&format!("{LONG_LINE_MARK}{}{LONG_LINE_MARK_END}", line.len()));
        } else {
            out.push_str(line);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn marker_cut_lines(n: usize) -> String {
    format!("[lanes: {n} more line(s) of this hunk cut]")
}

/// Applies the budget to one commit's unified diff.
pub fn trim(diff: &str, max_tokens: usize) -> Trimmed {
    let diff = shorten_long_lines(diff);
    let (preamble, files) = parse(&diff);
    let paths: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
    let noise: Vec<(String, Noise)> =
        files.iter().filter_map(|f| f.noise.map(|n| (f.path.clone(), n))).collect();
    let substance: Vec<&FileDiff<'_>> = files.iter().filter(|f| f.noise.is_none()).collect();
    let noise_only = substance.is_empty();

    // Fixed part: preamble, every header (noise files reduced to one line and a marker), every
    // hunk's first line.
    let fixed: Vec<String> = preamble.iter().map(|l| (*l).to_owned()).collect();
    let mut blocks: Vec<Block> = Vec::new();
    for f in &files {
        match f.noise {
            Some(n) => blocks.push(Block::Fixed(vec![
                f.header[0].to_owned(),
                format!("[lanes: {} changes omitted: +{} -{} lines]", n.as_str(), f.added, f.removed),
            ])),
            None => {
                blocks.push(Block::Fixed(f.header.iter().map(|l| (*l).to_owned()).collect()));
                for h in &f.hunks {
                    blocks.push(Block::Hunk { head: h.head, lines: &h.lines });
                }
            }
        }
    }
    let full_cost = |blocks: &[Block<'_>]| -> usize {
        blocks
            .iter()
            .map(|b| match b {
                Block::Fixed(ls) => ls.iter().map(|l| count_tokens(l) + 1).sum::<usize>(),
                Block::Hunk { head, lines } => count_tokens(head) + 1 + capped_cost(lines, max_tokens + 1).0,
            })
            .sum::<usize>()
            + fixed.iter().map(|l| count_tokens(l) + 1).sum::<usize>()
    };
    let total = full_cost(&blocks);
    if total <= max_tokens {
        let text = assemble(&fixed, &blocks, None);
        let tokens = count_tokens(&text);
        if tokens <= max_tokens {
            return Trimmed { text, tokens, cut: !noise.is_empty(), files: paths, noise, noise_only };
        }
    }
    // Over budget: every hunk's body shares what is left after the fixed parts, water-filled so small
    // hunks keep everything and large ones share the rest equally.
    let mut budget = max_tokens;
    for _ in 0..4 {
        let text = cut_to(&fixed, &blocks, budget, max_tokens);
        let tokens = count_tokens(&text);
        if tokens <= max_tokens {
            return Trimmed { text, tokens, cut: true, files: paths, noise, noise_only };
        }
        budget = budget.saturating_sub(tokens - max_tokens + max_tokens / 50);
    }
    // Pathological input (thousands of files): keep whole lines from the start while they fit.
    let text = cut_to(&fixed, &blocks, 0, max_tokens);
    let mut out = String::new();
    let mut used = 0;
    for line in text.lines() {
        let c = count_tokens(line) + 1;
        if used + c + 20 > max_tokens {
            out.push_str("[lanes: the rest of this diff was cut]\n");
            break;
        }
        used += c;
        out.push_str(line);
        out.push('\n');
    }
    let tokens = count_tokens(&out);
    Trimmed { text: out, tokens, cut: true, files: paths, noise, noise_only }
}

enum Block<'a> {
    Fixed(Vec<String>),
    Hunk { head: &'a str, lines: &'a [&'a str] },
}

/// Tokens of lines (each with its newline) up to `cap`: `(cost, lines that fit within cap)`.
fn capped_cost(lines: &[&str], cap: usize) -> (usize, usize) {
    let mut cost = 0;
    for (i, l) in lines.iter().enumerate() {
        let c = count_tokens(l) + 1;
        if cost + c > cap {
            return (cost + c, i);
        }
        cost += c;
    }
    (cost, lines.len())
}

fn cut_to(fixed: &[String], blocks: &[Block<'_>], budget: usize, max_tokens: usize) -> String {
    let fixed_cost: usize = fixed.iter().map(|l| count_tokens(l) + 1).sum::<usize>()
        + blocks
            .iter()
            .map(|b| match b {
                Block::Fixed(ls) => ls.iter().map(|l| count_tokens(l) + 1).sum::<usize>(),
                // The head, plus room for a cut marker.
                Block::Hunk { head, .. } => count_tokens(head) + 1 + 12,
            })
            .sum::<usize>();
    let mut left = budget.saturating_sub(fixed_cost);
    let hunks: Vec<usize> =
        blocks.iter().enumerate().filter(|(_, b)| matches!(b, Block::Hunk { .. })).map(|(i, _)| i).collect();
    let mut want: Vec<(usize, usize)> = hunks
        .iter()
        .map(|&i| match &blocks[i] {
            Block::Hunk { lines, .. } => (i, capped_cost(lines, max_tokens + 1).0),
            Block::Fixed(_) => (i, 0),
        })
        .collect();
    want.sort_by_key(|&(_, c)| c);
    let mut allowance = vec![0usize; blocks.len()];
    let mut remaining = want.len();
    for (i, cost) in want {
        let share = left / remaining.max(1);
        let give = cost.min(share);
        allowance[i] = give;
        left -= give;
        remaining -= 1;
    }
    assemble(fixed, blocks, Some(&allowance))
}

fn assemble(fixed: &[String], blocks: &[Block<'_>], allowance: Option<&[usize]>) -> String {
    let mut out = String::new();
    let mut push = |l: &str| {
        out.push_str(l);
        out.push('\n');
    };
    for l in fixed {
        push(l);
    }
    for (i, b) in blocks.iter().enumerate() {
        match b {
            Block::Fixed(ls) => ls.iter().for_each(|l| push(l)),
            Block::Hunk { head, lines } => {
                push(head);
                let keep = match allowance {
                    None => lines.len(),
                    Some(a) => capped_cost(lines, a[i]).1,
                };
                lines[..keep].iter().for_each(|l| push(l));
                if keep < lines.len() {
                    push(&marker_cut_lines(lines.len() - keep));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, hunks: &[(&str, Vec<String>)]) -> String {
        let mut s = format!(
            "diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
        );
        for (head, lines) in hunks {
            s.push_str(head);
            s.push('\n');
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }

    #[test]
    fn a_long_line_anywhere_is_shortened_before_tokenizing() {
        // A 20 MB minified line after a hundred ordinary lines of the same file.
        let mut lines: Vec<String> = (0..100).map(|i| format!("+let x{i} = {i};")).collect();
        lines.push(format!("+{}", "a=1;".repeat(5_000_000)));
        let t = trim(&file("web/app.js", &[("@@ -0,0 +1,101 @@", lines)]), DIFF_TOKENS);
        assert!(t.tokens <= DIFF_TOKENS);
        assert!(t.text.len() < 20_000, "{} bytes kept", t.text.len());
        assert!(t.text.contains("-byte line cut]"), "the cut is marked");
        // Mostly long lines: the file is minified noise.
        let blob: Vec<String> = (0..20)
            .map(|i| if i % 2 == 0 { format!("+{}", "z".repeat(5_000)) } else { "+x".into() })
            .collect();
        let mixed = format!(
            "{}{}",
            file("src/main.rs", &[("@@ -1 +1 @@", vec!["+fn main() {}".into()])]),
            file("assets/data.js", &[("@@ -0,0 +1,20 @@", blob)])
        );
        let t = trim(&mixed, DIFF_TOKENS);
        assert_eq!(t.noise, vec![("assets/data.js".to_owned(), Noise::Minified)]);
        assert!(t.text.contains("fn main()"));
        assert!(matches!(shorten_long_lines("+short\n"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn a_small_diff_is_kept_whole() {
        let d = file("src/lib.rs", &[("@@ -1,2 +1,2 @@", vec!["-a".into(), "+b".into(), " c".into()])]);
        let t = trim(&d, DIFF_TOKENS);
        assert_eq!(t.text, d);
        assert!(!t.cut && !t.noise_only);
        assert_eq!(t.tokens, count_tokens(&d));
    }

    #[test]
    fn a_five_megabyte_lockfile_costs_nothing() {
        let lines: Vec<String> =
            (0..100_000).map(|i| format!("+checksum = \"{:064x}\"", i as u128 * 7919)).collect();
        let d = file("Cargo.lock", &[("@@ -0,0 +1,100000 @@", lines)]);
        assert!(d.len() > 5_000_000, "{}", d.len());
        let t = trim(&d, DIFF_TOKENS);
        assert!(t.noise_only, "only noise: no model call");
        assert_eq!(t.noise, vec![("Cargo.lock".to_owned(), Noise::Lockfile)]);
        assert!(t.tokens < 40, "{} tokens", t.tokens);
        assert!(t.rule_summary().contains("lockfile") && t.rule_summary().contains("Cargo.lock"));
    }

    #[test]
    fn noise_is_dropped_but_source_is_kept() {
        let mut d = file("src/main.rs", &[("@@ -1 +1 @@", vec!["-old".into(), "+new".into()])]);
        d.push_str(&file("vendor/x/lib.go", &[("@@ -1 +1 @@", vec!["+x".into()])]));
        d.push_str("diff --git a/logo.png b/logo.png\nindex 1..2 100644\nBinary files a/logo.png and b/logo.png differ\n");
        d.push_str(&file("web/app.min.js", &[("@@ -1 +1 @@", vec![format!("+{}", "x;".repeat(2000))])]));
        d.push_str(&file("api.rs", &[("@@ -1 +1 @@", vec!["+// @generated by prost".into()])]));
        let t = trim(&d, DIFF_TOKENS);
        assert!(!t.noise_only && t.cut);
        let kinds: Vec<Noise> = t.noise.iter().map(|(_, n)| *n).collect();
        assert_eq!(kinds, [Noise::Vendored, Noise::Binary, Noise::Generated, Noise::Generated]);
        assert!(t.text.contains("+new") && !t.text.contains("x;x;"));
        assert_eq!(t.files.len(), 5);
    }

    #[test]
    fn a_huge_source_diff_is_cut_keeping_every_header_and_hunk_start() {
        let mut d = String::new();
        for f in 0..10 {
            let hunks: Vec<(String, Vec<String>)> = (0..4)
                .map(|h| {
                    let lines = (0..400)
                        .map(|i| format!("+    let value_{f}_{h}_{i} = compute({i}, \"{f}\");"))
                        .collect();
                    (format!("@@ -{0},0 +{0},1500 @@ fn part_{h}()", h * 2000 + 1), lines)
                })
                .collect();
            let refs: Vec<(&str, Vec<String>)> = hunks.iter().map(|(h, l)| (h.as_str(), l.clone())).collect();
            d.push_str(&file(&format!("src/mod_{f}.rs"), &refs));
        }
        assert!(count_tokens(&d) > 100_000);
        let t = trim(&d, DIFF_TOKENS);
        assert!(t.tokens <= DIFF_TOKENS, "{} tokens", t.tokens);
        assert_eq!(t.tokens, count_tokens(&t.text));
        assert!(t.cut && !t.noise_only);
        for f in 0..10 {
            assert!(t.text.contains(&format!("diff --git a/src/mod_{f}.rs b/src/mod_{f}.rs")), "header {f}");
            for h in 0..4 {
                assert!(t.text.contains(&format!("fn part_{h}()")), "hunk {h}");
            }
        }
        assert!(t.text.contains("more line(s) of this hunk cut"));
        // The budget is used, not wasted.
        assert!(t.tokens > DIFF_TOKENS * 8 / 10, "{} tokens", t.tokens);
    }

    #[test]
    fn thousands_of_files_still_fit() {
        let d: String = (0..3_000)
            .map(|f| file(&format!("src/f{f}.rs"), &[("@@ -1 +1 @@", vec!["+x".into()])]))
            .collect();
        let t = trim(&d, DIFF_TOKENS);
        assert!(t.tokens <= DIFF_TOKENS && t.text.ends_with("[lanes: the rest of this diff was cut]\n"));
    }
}
