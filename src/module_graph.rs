//! The crate's modules use each other without a cycle (issue #23 item 7): modules in a
//! cycle are one unit that can only be read, tested and changed together.
//!
//! The reference is cargo-modules (`cargo modules dependencies -p agent-sandbox-engine
//! --lib [--cfg-test] --no-externs --no-sysroot --no-fns --no-traits --no-types
//! --no-owns`, the same with `-p agent-sandbox-core`, then the strongly connected
//! components of its "uses" edges). CI does not have it, so this rebuilds that graph from
//! the sources, with and without `cfg(test)`, as cargo-modules builds it:
//!
//! - the modules are the files reached by `mod name;` from `src/engine.rs` (the engine
//!   package's root) and `src/lib.rs` (the server's, which names the engine's modules
//!   with a `use`; read as one root, so a use across the two crates is an edge like any
//!   other; every `.rs` file under `src/` but `main.rs` and `bin/` must be one) and
//!   inline `mod name { .. }`;
//! - a `use` (any visibility, nested trees, `self`/`super`/`crate`/child-relative paths)
//!   is an edge to the module that *defines* what it names, re-exports followed: `use
//!   super::X` where the parent only re-exports `X` from a sibling is an edge to the
//!   sibling. Uses of consts, statics, macros and variants are no edge (cargo-modules
//!   drops them); a glob uses everything it brings in;
//! - the types of fn parameters and results, of fields and of type aliases are edges
//!   too; bounds, trait items and fn bodies are not;
//! - an `impl` block (inherent or of a trait) counts as its type's module's: `impl
//!   Response { fn sse(s: SseStream) }` written in `http::sse` makes `http::response` use
//!   `http::sse`.
//!
//! One difference on purpose: a crate type inside a std generic (`Arc<Agents>`,
//! `Result<_, AgentError>`) is an edge here, and none for cargo-modules, which cannot
//! resolve std with `--no-sysroot`; this graph has a few edges more. Not modelled: what
//! macros expand to, `#[path]`, cfgs other than `cfg(test)` (what they gate counts in
//! both graphs), visibility finer than `pub` or not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles tolerated for now, each as its sorted module paths: none. An entry here is a
/// debt with a reason, and the test fails once it is paid, so the list never lies.
const KNOWN_CYCLES: &[&[&str]] = &[];

struct Tok {
    text: String,
    line: u32,
}

/// Rust tokens with comments, literals and lifetimes dropped: what is left are
/// identifiers (raw ones unprefixed), `::` and single punctuation characters.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |j: usize| c.get(j).copied().unwrap_or('\0');
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1u32);
    // Skips a quoted string whose opening quote is at `i`; returns the index after it.
    let skip_string = |mut i: usize, line: &mut u32| {
        i += 1;
        while i < c.len() {
            match c[i] {
                '\\' => {
                    if at(i + 1) == '\n' {
                        *line += 1;
                    }
                    i += 2;
                    continue;
                }
                '"' => return i + 1,
                '\n' => *line += 1,
                _ => {}
            }
            i += 1;
        }
        i
    };
    // Skips a char literal whose opening quote is at `i`.
    let skip_char = |mut i: usize| {
        if at(i + 1) == '\\' {
            i += 3;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i + 1
        } else {
            i + 3
        }
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(i, &mut line);
        } else if ch == '\'' {
            if at(i + 1) == '\\' || at(i + 2) == '\'' {
                i = skip_char(i);
            } else {
                // A lifetime or label.
                i += 1;
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
        } else if ident_char(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_string = at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '"' | '#'));
            if matches!(word.as_str(), "r" | "br" | "cr") && raw_string {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1;
                while i < c.len() {
                    if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            } else if word == "r" && at(i) == '#' {
                // A raw identifier: the `#` goes, the name is read next round.
                i += 1;
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_string(i, &mut line);
            } else if word == "b" && at(i) == '\'' {
                i = skip_char(i);
            } else {
                toks.push(Tok { text: word, line });
            }
        } else if ch == ':' && at(i + 1) == ':' {
            toks.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            toks.push(Tok {
                text: ch.to_string(),
                line,
            });
            i += 1;
        }
    }
    toks
}

/// What a `use` of an item counts as: cargo-modules keeps uses of types, traits and fns
/// (as uses of their module) and drops uses of consts, statics, macros and variants.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A struct, enum, union, trait or type alias.
    Type,
    Fn,
    /// A const, static or macro.
    Value,
}

/// What a path names.
#[derive(Clone, PartialEq, Eq)]
enum Target {
    Module(String),
    Item(String, Kind),
}

struct Import {
    /// The name it binds; `None` for a glob.
    name: Option<String>,
    /// The path as written.
    path: Vec<String>,
    public: bool,
    line: u32,
    test: bool,
}

/// The types an item's signature names (fn parameters and result, fields, an alias's
/// type), and whose they are: the item's module's, or for an `impl` block its type's
/// (`self_ty`, resolved where the block is written).
struct Signature {
    self_ty: Option<Vec<String>>,
    types: Vec<(Vec<String>, u32)>,
    test: bool,
}

#[derive(Default)]
struct Module {
    file: PathBuf,
    test: bool,
    public: bool,
    children: BTreeSet<String>,
    /// Items defined here: kind, and whether `pub` (in any form).
    defs: BTreeMap<String, (Kind, bool)>,
    imports: Vec<Import>,
    signatures: Vec<Signature>,
}

fn child_of(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_string()
    } else {
        format!("{module}::{name}")
    }
}

fn parent_of(module: &str) -> Option<&str> {
    match module.rsplit_once("::") {
        Some((parent, _)) => Some(parent),
        None if module.is_empty() => None,
        None => Some(""),
    }
}

/// Whether `from` sees `of`'s private items: it is `of` or inside it.
fn inside(from: &str, of: &str) -> bool {
    of.is_empty() || from == of || from.starts_with(&format!("{of}::"))
}

fn shown(module: &str) -> &str {
    if module.is_empty() {
        "crate"
    } else {
        module
    }
}

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "box", "break", "const", "continue", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "static", "struct", "trait", "true", "type", "unsafe", "use", "where",
    "while", "Self",
];

fn is_ident(text: &str) -> bool {
    text.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The paths in a run of tokens (a type, or a tuple's types), attributes and
/// visibilities left out.
fn paths_in(toks: &[Tok]) -> Vec<(Vec<String>, u32)> {
    let mut paths = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].text.as_str();
        if t == "#" || t == "pub" {
            // `#[..]`, `pub(..)`: skip the group that follows.
            let mut j = i + 1;
            if toks.get(j).is_some_and(|t| t.text == "!") {
                j += 1;
            }
            let (open, close) = if t == "#" { ("[", "]") } else { ("(", ")") };
            if toks.get(j).is_some_and(|t| t.text == open) {
                let mut depth = 0;
                while j < toks.len() {
                    if toks[j].text == open {
                        depth += 1;
                    } else if toks[j].text == close {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    j += 1;
                }
                i = j + 1;
            } else {
                i += 1;
            }
            continue;
        }
        let after_sep = i > 0 && toks[i - 1].text == "::";
        if !is_ident(t) || KEYWORDS.contains(&t) || after_sep {
            i += 1;
            continue;
        }
        let line = toks[i].line;
        let mut path = vec![t.to_string()];
        i += 1;
        while i + 1 < toks.len() && toks[i].text == "::" && is_ident(&toks[i + 1].text) {
            path.push(toks[i + 1].text.clone());
            i += 2;
        }
        if path.len() > 1 || !matches!(t, "self" | "crate" | "super") {
            paths.push((path, line));
        }
    }
    paths
}

/// `toks` cut at each top-level `sep`, brackets and generics counted.
fn split_top<'t>(toks: &'t [Tok], sep: &str) -> Vec<&'t [Tok]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            ">" if i == 0 || toks[i - 1].text != "-" => depth -= 1,
            s if s == sep && depth == 0 => {
                parts.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&toks[start..]);
    parts
}

/// The types of `name: Type` entries (parameters, named fields).
fn typed_entries(inner: &[Tok]) -> Vec<(Vec<String>, u32)> {
    split_top(inner, ",")
        .into_iter()
        .flat_map(|entry| split_top(entry, ":").into_iter().skip(1))
        .flat_map(paths_in)
        .collect()
}

struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.toks.get(self.pos).map(|t| t.text.as_str())
    }

    fn peek_at(&self, ahead: usize) -> Option<&'a str> {
        self.toks.get(self.pos + ahead).map(|t| t.text.as_str())
    }

    fn line(&self) -> u32 {
        self.toks.get(self.pos).map_or(0, |t| t.line)
    }

    /// Skips the bracketed group opening at the current token, returning what is inside.
    fn group(&mut self) -> &'a [Tok] {
        let start = self.pos;
        let mut depth = 0i32;
        while let Some(t) = self.peek() {
            self.pos += 1;
            match t {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => {
                    depth -= 1;
                    if depth <= 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = self.pos.saturating_sub(1).max(start + 1);
        self.toks.get(start + 1..end).unwrap_or_default()
    }

    /// Skips `<..>` generics when they open here (`->` inside does not close them).
    fn generics(&mut self) {
        if self.peek() != Some("<") {
            return;
        }
        let mut depth = 0;
        while let Some(t) = self.peek() {
            let arrow = self.pos > 0 && self.toks[self.pos - 1].text == "-";
            self.pos += 1;
            match t {
                "<" => depth += 1,
                ">" if !arrow => {
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    /// The tokens up to a top-level `{` or `;` (or `stop`), brackets skipped whole.
    fn until_body(&mut self, stop: &str) -> &'a [Tok] {
        let start = self.pos;
        while let Some(t) = self.peek() {
            match t {
                "{" | ";" => break,
                "(" | "[" => {
                    self.group();
                }
                _ if t == stop => break,
                _ => self.pos += 1,
            }
        }
        &self.toks[start..self.pos]
    }

    /// Skips a const's or static's rest, its value included.
    fn skip_value(&mut self) {
        self.until_body("");
        while self.peek() == Some("{") {
            self.group();
            self.until_body("");
        }
    }

    /// A fn from its name on: the types of its parameters and result, as cargo-modules
    /// reads them (not its bounds, not its body).
    fn fn_signature(&mut self) -> Vec<(Vec<String>, u32)> {
        self.pos += 1;
        self.generics();
        let mut types = Vec::new();
        if self.peek() == Some("(") {
            types.extend(typed_entries(self.group()));
        }
        if self.peek() == Some("-") && self.peek_at(1) == Some(">") {
            self.pos += 2;
            types.extend(paths_in(self.until_body("where")));
        }
        self.until_body("");
        if self.peek() == Some("{") {
            self.group();
        }
        types
    }

    /// A struct or union from its name on: its fields' types.
    fn struct_fields(&mut self) -> Vec<(Vec<String>, u32)> {
        self.pos += 1;
        self.generics();
        if self.peek() == Some("(") {
            let types = paths_in(self.group());
            self.until_body("");
            return types;
        }
        self.until_body("");
        if self.peek() == Some("{") {
            return typed_entries(self.group());
        }
        Vec::new()
    }

    /// An enum from its name on: its variants' field types.
    fn variant_fields(&mut self) -> Vec<(Vec<String>, u32)> {
        self.pos += 1;
        self.generics();
        self.until_body("");
        if self.peek() != Some("{") {
            return Vec::new();
        }
        let mut types = Vec::new();
        for variant in split_top(self.group(), ",") {
            let mut p = Parser {
                toks: variant,
                pos: 0,
            };
            while let Some(t) = p.peek() {
                match t {
                    "#" => {
                        p.attribute();
                    }
                    "(" => types.extend(paths_in(p.group())),
                    "{" => types.extend(typed_entries(p.group())),
                    "=" => break,
                    _ => p.pos += 1,
                }
            }
        }
        types
    }

    /// A type alias from its name on: the aliased type.
    fn alias_type(&mut self) -> Vec<(Vec<String>, u32)> {
        self.until_body("=");
        if self.peek() != Some("=") {
            return Vec::new();
        }
        self.pos += 1;
        paths_in(self.until_body(""))
    }

    /// An attribute; whether it is `#[cfg(test)]`.
    fn attribute(&mut self) -> bool {
        self.pos += 1;
        if self.peek() == Some("!") {
            self.pos += 1;
        }
        let inner: Vec<&str> = self.group().iter().map(|t| t.text.as_str()).collect();
        inner == ["cfg", "(", "test", ")"]
    }

    fn use_tree(&mut self, prefix: &[String], public: bool, test: bool, out: &mut Vec<Import>) {
        let mut path = prefix.to_vec();
        let line = self.line();
        loop {
            match self.peek() {
                Some("{") => {
                    self.pos += 1;
                    while !matches!(self.peek(), Some("}") | None) {
                        self.use_tree(&path, public, test, out);
                        if self.peek() == Some(",") {
                            self.pos += 1;
                        }
                    }
                    self.pos += 1;
                    return;
                }
                Some("*") => {
                    self.pos += 1;
                    out.push(Import {
                        name: None,
                        path,
                        public,
                        line,
                        test,
                    });
                    return;
                }
                Some("::") => self.pos += 1,
                Some(seg) if is_ident(seg) => {
                    self.pos += 1;
                    if self.peek() == Some("::") {
                        path.push(seg.to_string());
                        continue;
                    }
                    // `foo::{self}` binds `foo`.
                    if seg != "self" || path.is_empty() {
                        path.push(seg.to_string());
                    }
                    let mut name = path.last().cloned();
                    if self.peek() == Some("as") {
                        name = self.peek_at(1).map(String::from);
                        self.pos += 2;
                    }
                    out.push(Import {
                        name,
                        path,
                        public,
                        line,
                        test,
                    });
                    return;
                }
                _ => return,
            }
        }
    }

    /// An `impl` block from its generics on.
    fn impl_block(&mut self, test: bool) -> Signature {
        self.generics();
        let self_ty = impl_self_type(self.until_body(""));
        let mut types = Vec::new();
        if self.peek() == Some("{") {
            let mut p = Parser {
                toks: self.group(),
                pos: 0,
            };
            while let Some(t) = p.peek() {
                match t {
                    "#" => {
                        p.attribute();
                    }
                    "fn" => {
                        p.pos += 1;
                        types.extend(p.fn_signature());
                    }
                    "type" => {
                        p.pos += 1;
                        types.extend(p.alias_type());
                    }
                    "const" if p.peek_at(1).is_some_and(|t| t != "fn") => p.skip_value(),
                    "(" | "[" | "{" => {
                        p.group();
                    }
                    _ => p.pos += 1,
                }
            }
        }
        Signature {
            self_ty,
            types,
            test,
        }
    }

    /// A module's items, up to its closing `}` when `inline`.
    fn items(&mut self, graph: &mut Graph, module: &str, test: bool, inline: bool) {
        let (mut cfg_test, mut public) = (false, false);
        while let Some(t) = self.peek() {
            let item_test = test || cfg_test;
            let def = |graph: &mut Graph, name: Option<&str>, kind: Kind| {
                if let Some(name) = name.filter(|n| *n != "_") {
                    let defs = &mut graph.module(module).defs;
                    defs.insert(name.to_string(), (kind, public));
                }
            };
            let signature = |graph: &mut Graph, self_ty, types| {
                graph.module(module).signatures.push(Signature {
                    self_ty,
                    types,
                    test: item_test,
                });
            };
            match t {
                "}" if inline => {
                    self.pos += 1;
                    return;
                }
                "#" => {
                    cfg_test |= self.attribute();
                    continue;
                }
                "pub" => {
                    self.pos += 1;
                    public = true;
                    if self.peek() == Some("(") {
                        self.group();
                    }
                    continue;
                }
                "unsafe" | "async" | "default" | "auto" => {
                    self.pos += 1;
                    continue;
                }
                "const"
                    if matches!(self.peek_at(1), Some("fn" | "unsafe" | "async" | "extern")) =>
                {
                    self.pos += 1;
                    continue;
                }
                "extern" => {
                    self.pos += 1;
                    match self.peek() {
                        Some("crate") => {
                            self.until_body("");
                        }
                        Some("{") => {
                            self.group();
                        }
                        _ => continue,
                    }
                }
                "use" => {
                    self.pos += 1;
                    let mut imports = Vec::new();
                    self.use_tree(&[], public, item_test, &mut imports);
                    graph.module(module).imports.extend(imports);
                }
                "mod" => {
                    let name = self.peek_at(1).unwrap_or_default().to_string();
                    self.pos += 2;
                    let child = child_of(module, &name);
                    graph.module(module).children.insert(name);
                    let file = graph.module(module).file.clone();
                    let entry = graph.module(&child);
                    entry.test = item_test;
                    entry.public = public;
                    entry.file = file;
                    if self.peek() == Some("{") {
                        self.pos += 1;
                        self.items(graph, &child, item_test, true);
                    } else {
                        graph.pending.push(child);
                    }
                }
                "fn" | "struct" | "enum" | "union" | "type" | "trait" | "const" | "static"
                    if self.peek_at(1).is_some_and(is_ident) =>
                {
                    self.pos += 1;
                    if t == "static" && self.peek() == Some("mut") {
                        self.pos += 1;
                    }
                    let name = self.peek();
                    match t {
                        "fn" => {
                            def(graph, name, Kind::Fn);
                            let types = self.fn_signature();
                            signature(graph, None, types);
                        }
                        "struct" | "union" => {
                            def(graph, name, Kind::Type);
                            let types = self.struct_fields();
                            signature(graph, None, types);
                        }
                        "enum" => {
                            def(graph, name, Kind::Type);
                            let types = self.variant_fields();
                            signature(graph, None, types);
                        }
                        "type" => {
                            def(graph, name, Kind::Type);
                            let types = self.alias_type();
                            signature(graph, None, types);
                        }
                        "trait" => {
                            // cargo-modules reads nothing of a trait's.
                            def(graph, name, Kind::Type);
                            self.until_body("");
                            self.group();
                        }
                        _ => {
                            def(graph, name, Kind::Value);
                            self.skip_value();
                        }
                    }
                }
                "impl" => {
                    self.pos += 1;
                    let sig = self.impl_block(item_test);
                    graph.module(module).signatures.push(sig);
                }
                "macro_rules" => {
                    self.pos += 2;
                    def(graph, self.peek(), Kind::Value);
                    self.pos += 1;
                    self.group();
                }
                _ if is_ident(t) && self.peek_at(1) == Some("!") => {
                    // A macro call at item level.
                    self.pos += 2;
                    if self.peek().is_some_and(is_ident) {
                        self.pos += 1;
                    }
                    self.group();
                }
                _ => self.pos += 1,
            }
            (cfg_test, public) = (false, false);
        }
    }
}

/// The type an impl header (after its generics) is for: after the `for` of a trait impl,
/// before `where`; `None` unless a path (cargo-modules skips impls for references,
/// tuples, trait objects).
fn impl_self_type(header: &[Tok]) -> Option<Vec<String>> {
    let header: Vec<&str> = header.iter().map(|t| t.text.as_str()).collect();
    let header = match header.iter().position(|t| *t == "where") {
        Some(w) => &header[..w],
        None => &header[..],
    };
    let mut depth = 0;
    let mut start = 0;
    for (i, t) in header.iter().enumerate() {
        match *t {
            "<" => depth += 1,
            ">" => depth -= 1,
            "for" if depth == 0 && header.get(i + 1) != Some(&"<") => start = i + 1,
            _ => {}
        }
    }
    let mut ty = header[start..].iter().copied();
    let first = ty.next()?;
    if !is_ident(first) || KEYWORDS.contains(&first) {
        return None;
    }
    let mut path = vec![first.to_string()];
    while let (Some("::"), Some(seg)) = (ty.next(), ty.next()) {
        path.push(seg.to_string());
    }
    Some(path)
}

#[derive(Default)]
struct Graph {
    modules: BTreeMap<String, Module>,
    /// Modules declared `mod name;` whose file is not read yet.
    pending: Vec<String>,
}

struct Edge {
    from: String,
    to: String,
    file: PathBuf,
    line: u32,
    test: bool,
}

/// The root of the engine package, beside `lib.rs` in `src/`.
const ENGINE_ROOT: &str = "engine.rs";

/// How deep re-exports and globs are followed.
const MAX_DEPTH: usize = 16;

impl Graph {
    fn module(&mut self, path: &str) -> &mut Module {
        self.modules.entry(path.to_string()).or_default()
    }

    fn load(src: &Path) -> Graph {
        let mut graph = Graph::default();
        // The engine package's root (src/engine.rs) declares the modules below the
        // server's, which the server's root (src/lib.rs) brings in by name with a `use`:
        // read as one root, the two crates are one graph, as the paths in them say.
        for root in [ENGINE_ROOT, "lib.rs"] {
            let file = src.join(root);
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let toks = lex(&text);
            graph.module("").file = file;
            let mut parser = Parser {
                toks: &toks,
                pos: 0,
            };
            parser.items(&mut graph, "", false, false);
        }
        while let Some(module) = graph.pending.pop() {
            let file = {
                // Next to the declaring file when that is a `mod.rs` or `lib.rs`, else in
                // the directory named after it; inline modules in between are directories.
                let parent = graph.modules[&module].file.clone();
                let mut dir = match parent.file_name().and_then(|n| n.to_str()) {
                    Some("mod.rs" | "lib.rs") => parent.parent().unwrap().to_path_buf(),
                    _ if parent == src.join(ENGINE_ROOT) => src.to_path_buf(),
                    _ => parent.with_extension(""),
                };
                let declared_in = module_of_file(src, &parent);
                let (inline, name) = module
                    .strip_prefix(&declared_in)
                    .unwrap_or_default()
                    .trim_start_matches("::")
                    .rsplit_once("::")
                    .unwrap_or(("", module.rsplit("::").next().unwrap()));
                for segment in inline.split("::").filter(|s| !s.is_empty()) {
                    dir.push(segment);
                }
                let flat = dir.join(format!("{name}.rs"));
                if flat.exists() {
                    flat
                } else {
                    dir.join(name).join("mod.rs")
                }
            };
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e} (module {})", file.display(), shown(&module)));
            let toks = lex(&text);
            let test = graph.modules[&module].test;
            graph.module(&module).file = file;
            let mut parser = Parser {
                toks: &toks,
                pos: 0,
            };
            parser.items(&mut graph, &module, test, false);
        }
        graph
    }

    /// What `name` means in `module`: a module, an item, or both (a module and a fn of
    /// one name live in different namespaces, and a `use` of the name imports both).
    fn lookup(&self, module: &str, name: &str, depth: usize) -> Vec<Target> {
        let mut out = Vec::new();
        let Some(m) = self.modules.get(module) else {
            return out;
        };
        if depth > MAX_DEPTH {
            return out;
        }
        if m.children.contains(name) {
            out.push(Target::Module(child_of(module, name)));
        }
        if let Some((kind, _)) = m.defs.get(name) {
            out.push(Target::Item(module.to_string(), *kind));
        }
        for import in m.imports.iter().filter(|i| i.name.as_deref() == Some(name)) {
            out.extend(self.resolve(module, &import.path, depth + 1));
        }
        if out.is_empty() {
            for glob in m.imports.iter().filter(|i| i.name.is_none()) {
                for from in modules(self.resolve(module, &glob.path, depth + 1)) {
                    let offered = self.offered(&from, module, depth + 1);
                    out.extend(
                        offered
                            .into_iter()
                            .filter(|(n, _)| n == name)
                            .map(|(_, t)| t),
                    );
                }
            }
        }
        out
    }

    /// The names `module` offers a glob import written in `to`.
    fn offered(&self, module: &str, to: &str, depth: usize) -> Vec<(String, Target)> {
        let mut out = Vec::new();
        let Some(m) = self.modules.get(module) else {
            return out;
        };
        if depth > MAX_DEPTH || module == to {
            return out;
        }
        let sees = inside(to, module);
        for child in &m.children {
            let path = child_of(module, child);
            if sees || self.modules[&path].public {
                out.push((child.clone(), Target::Module(path)));
            }
        }
        for (name, (kind, public)) in &m.defs {
            if sees || *public {
                out.push((name.clone(), Target::Item(module.to_string(), *kind)));
            }
        }
        for import in m.imports.iter().filter(|i| sees || i.public) {
            let targets = self.resolve(module, &import.path, depth + 1);
            match &import.name {
                Some(name) => out.extend(targets.into_iter().map(|t| (name.clone(), t))),
                None => {
                    for from in modules(targets) {
                        out.extend(self.offered(&from, to, depth + 1));
                    }
                }
            }
        }
        out
    }

    /// What `path`, written in `module`, names; nothing outside the crate, and nothing
    /// for a variant or an associated item (cargo-modules drops those).
    fn resolve(&self, module: &str, path: &[String], depth: usize) -> Vec<Target> {
        let Some((first, mut rest)) = path.split_first() else {
            return Vec::new();
        };
        let mut at = match first.as_str() {
            "crate" => String::new(),
            "self" => module.to_string(),
            "super" => {
                let mut at = parent_of(module);
                while rest.first().is_some_and(|s| s == "super") {
                    at = at.and_then(parent_of);
                    rest = &rest[1..];
                }
                match at {
                    Some(at) => at.to_string(),
                    None => return Vec::new(),
                }
            }
            _ => {
                let meanings = self.lookup(module, first, depth);
                if rest.is_empty() {
                    return meanings;
                }
                match modules(meanings).next() {
                    Some(m) => m,
                    None => return Vec::new(),
                }
            }
        };
        while let Some((seg, tail)) = rest.split_first() {
            let meanings = self.lookup(&at, seg, depth + 1);
            if tail.is_empty() {
                return meanings;
            }
            match modules(meanings).next() {
                Some(m) => at = m,
                None => return Vec::new(),
            }
            rest = tail;
        }
        vec![Target::Module(at)]
    }

    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        let used = |target: Target| match target {
            Target::Module(m) | Target::Item(m, Kind::Type | Kind::Fn) => Some(m),
            Target::Item(_, Kind::Value) => None,
        };
        let types = |targets: Vec<Target>| {
            targets.into_iter().filter_map(|t| match t {
                Target::Item(m, Kind::Type) => Some(m),
                _ => None,
            })
        };
        for (path, m) in &self.modules {
            let mut add = |from: &str, to: String, line: u32, test: bool| {
                if to != from {
                    edges.push(Edge {
                        from: from.to_string(),
                        to,
                        file: m.file.clone(),
                        line,
                        test: m.test || test,
                    });
                }
            };
            let bound: BTreeSet<&str> = m
                .imports
                .iter()
                .filter_map(|i| i.name.as_deref())
                .chain(m.defs.keys().map(String::as_str))
                .collect();
            for import in &m.imports {
                let targets = self.resolve(path, &import.path, 0);
                if import.name.is_some() {
                    for to in targets.into_iter().filter_map(used) {
                        add(path, to, import.line, import.test);
                    }
                    continue;
                }
                // A glob uses whatever it brings in that the module does not bind itself.
                for from in modules(targets) {
                    for (name, target) in self.offered(&from, path, 0) {
                        if let Some(to) = used(target).filter(|_| !bound.contains(name.as_str())) {
                            add(path, to, import.line, import.test);
                        }
                    }
                }
            }
            for sig in &m.signatures {
                let owners: Vec<String> = match &sig.self_ty {
                    None => vec![path.clone()],
                    Some(ty) => types(self.resolve(path, ty, 0)).collect(),
                };
                for owner in owners {
                    for (ty, line) in &sig.types {
                        for to in types(self.resolve(path, ty, 0)) {
                            add(&owner, to, *line, sig.test);
                        }
                    }
                }
            }
        }
        edges
    }
}

fn modules(targets: Vec<Target>) -> impl Iterator<Item = String> {
    targets.into_iter().filter_map(|t| match t {
        Target::Module(m) => Some(m),
        Target::Item(..) => None,
    })
}

/// The module a file declares, by its path under `src/`.
fn module_of_file(src: &Path, file: &Path) -> String {
    if file == src.join(ENGINE_ROOT) {
        return String::new();
    }
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// Strongly connected components of more than one module, each sorted.
fn cycles(edges: &[&Edge]) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().insert(&e.to);
        next.entry(&e.to).or_default();
    }
    struct Tarjan<'g> {
        next: &'g BTreeMap<&'g str, BTreeSet<&'g str>>,
        index: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        /// Visits `v`; the lowest index reachable from it.
        fn visit(&mut self, v: &'g str) -> usize {
            let n = self.index.len();
            self.index.insert(v, n);
            self.stack.push(v);
            let mut low = n;
            let next = self.next;
            for &w in &next[v] {
                match self.index.get(w) {
                    None => low = low.min(self.visit(w)),
                    Some(&i) if self.stack.contains(&w) => low = low.min(i),
                    Some(_) => {}
                }
            }
            if low == n {
                let at = self.stack.iter().rposition(|s| *s == v).unwrap();
                let mut scc: Vec<String> = self
                    .stack
                    .drain(at..)
                    .map(|s| shown(s).to_string())
                    .collect();
                if scc.len() > 1 {
                    scc.sort();
                    self.found.push(scc);
                }
            }
            low
        }
    }
    let mut t = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for &v in next.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
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

fn src_dir() -> PathBuf {
    crate::testing::repo_root().join("src")
}

#[test]
fn every_source_file_is_a_module() {
    let src = src_dir();
    let graph = Graph::load(&src);
    let read: BTreeSet<&PathBuf> = graph.modules.values().map(|m| &m.file).collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let unread: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("bin")) && **f != src.join("main.rs"))
        .filter(|f| **f != src.join(ENGINE_ROOT))
        .filter(|f| !read.contains(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        unread.is_empty(),
        "not reached by `mod` from src/lib.rs or src/engine.rs, so not checked: {unread:?}"
    );
}

/// What is wrong with the module graph of the crate whose sources are `src`: each cycle
/// not in [`KNOWN_CYCLES`] with the uses that make it, and each known one that is gone.
fn cycle_report(src: &Path) -> String {
    let edges = Graph::load(src).edges();
    let known: Vec<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let mut report = String::new();
    let mut seen = Vec::new();
    for with_tests in [false, true] {
        let graph: Vec<&Edge> = edges.iter().filter(|e| with_tests || !e.test).collect();
        for cycle in cycles(&graph) {
            if seen.contains(&cycle) {
                continue;
            }
            seen.push(cycle.clone());
            if known.contains(&cycle) {
                continue;
            }
            let cfg = if with_tests { " (with cfg(test))" } else { "" };
            report.push_str(&format!("\ncycle{cfg}: {}\n", cycle.join(", ")));
            let member = |m: &str| cycle.iter().any(|c| c == shown(m));
            // Each use between two members, where it is written first and how often.
            let mut uses: BTreeMap<(&str, &str), (String, usize)> = BTreeMap::new();
            for e in graph.iter().filter(|e| member(&e.from) && member(&e.to)) {
                let file = e.file.strip_prefix(src).unwrap_or(&e.file);
                let at = format!("src/{}:{}", file.display(), e.line);
                let entry = uses.entry((shown(&e.from), shown(&e.to)));
                entry.or_insert((at, 0)).1 += 1;
            }
            for ((from, to), (at, n)) in uses {
                let more = if n > 1 {
                    format!(" and {} more", n - 1)
                } else {
                    String::new()
                };
                report.push_str(&format!("  {from} -> {to}  ({at}{more})\n"));
            }
        }
    }
    for cycle in &known {
        if !seen.contains(cycle) {
            report.push_str(&format!(
                "\nKNOWN_CYCLES lists {}, which is gone: take it off the list\n",
                cycle.join(", ")
            ));
        }
    }
    report
}

#[test]
fn modules_import_each_other_without_a_cycle() {
    let report = cycle_report(&src_dir());
    assert!(
        report.is_empty(),
        "modules that use each other (a child imports its siblings, not what its parent \
         re-exports; an impl belongs to its type's module):{report}"
    );
}
