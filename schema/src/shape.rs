//! The shape of a tool's payload: which key paths its JSON has and of which JSON type, values
//! ignored. Two answers of the same shape differ only in their values; a renamed, removed or
//! retyped field changes the shape. The `input_shape` and `output_shape` columns hold it, the
//! `answer_shapes` view, the metrics job and the viewer read it, and failure datasets group
//! arguments by it.
//!
//! The canonical form is compact JSON with the keys sorted and every value replaced by its
//! type (`"string"`, `"number"`, `"boolean"`, `"null"`), e.g.
//! `{"hits":[{"title":"string","url":"string"}],"total":"number"}`:
//!
//! - an array is `[]` when empty, else `[S]` with `S` the merge of its elements' shapes (the
//!   union of their keys; a key whose types differ holds them sorted and joined by `|`);
//! - an object with more than [`MAX_KEYS`] keys is a map, `{"*":S}` with `S` the merge of its
//!   values (ids as keys would otherwise make every answer a new shape);
//! - below [`MAX_DEPTH`] levels, and once [`MAX_NODES`] shapes have been written, a value is
//!   `"…"`;
//! - a payload that is not JSON is a kind instead: `empty`, `html`, `binary` or `text` (JSON
//!   text never reads as a bare word, so the two cannot be confused).
//!
//! [`id`] names a shape by 16 hex digits (FNV-1a, stable across processes and versions), for
//! labels and links; [`diff`] lists what changed between two shapes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

/// Levels below the top that are described; deeper values are `"…"`.
pub const MAX_DEPTH: usize = 8;
/// Keys an object may have before it is taken for a map (`{"*":…}`).
pub const MAX_KEYS: usize = 64;
/// Shapes (objects, arrays and leaves) written at most; the rest are `"…"`.
pub const MAX_NODES: usize = 512;

/// The shape of a payload: its canonical form, or its kind when it is not JSON.
pub fn of_text(text: &str) -> String {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return "empty".into();
    }
    if starts_like_json(trimmed) {
        let mut de = serde_json::Deserializer::from_str(text);
        if let Ok(node) = (Seed { depth: 0 }).deserialize(&mut de) {
            if de.end().is_ok() {
                return node.canonical();
            }
        }
    }
    kind_of(trimmed).into()
}

/// Whether non-empty text with no leading white space begins as a JSON value can: an object,
/// an array, a string, a literal or a number. Only such text is parsed.
fn starts_like_json(trimmed: &str) -> bool {
    let first = trimmed.as_bytes()[0];
    matches!(first, b'{' | b'[' | b'"' | b'-')
        || first.is_ascii_digit()
        || trimmed.starts_with("true")
        || trimmed.starts_with("false")
        || trimmed.starts_with("null")
}

/// The kind of a payload that is not JSON.
fn kind_of(trimmed: &str) -> &'static str {
    let head = &trimmed.as_bytes()[..trimmed.len().min(512)];
    if head
        .iter()
        .any(|&b| b == 0 || (b < 0x20 && !b"\t\n\r\x0c".contains(&b)))
    {
        return "binary";
    }
    if head.first() == Some(&b'<') {
        let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
        if lower.starts_with("<!doctype html") || lower.contains("<html") || lower.contains("<body")
        {
            return "html";
        }
    }
    "text"
}

/// Whether a shape is a JSON shape (not one of the kinds).
pub fn is_json(shape: &str) -> bool {
    matches!(shape.as_bytes().first(), Some(b'{' | b'[' | b'"'))
}

/// A shape's name: 16 hex digits of FNV-1a (64 bit) over its canonical form.
pub fn id(shape: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h = fnv1a(shape.as_bytes());
    let mut out = String::with_capacity(16);
    for i in 0..16 {
        out.push(char::from(HEX[((h >> (60 - 4 * i)) & 0xf) as usize]));
    }
    out
}

/// FNV-1a, 64 bit: stable across processes, platforms and versions.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// One difference between two shapes, at a key path (`$.hits[].url`; `$` is the top).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Where.
    pub path: String,
    /// Its type before (`None`: the field is new).
    pub before: Option<String>,
    /// Its type after (`None`: the field is gone).
    pub after: Option<String>,
}

impl Change {
    /// `added`, `removed` or `retyped`.
    pub fn kind(&self) -> &'static str {
        match (&self.before, &self.after) {
            (None, _) => "added",
            (_, None) => "removed",
            _ => "retyped",
        }
    }
}

/// What changed from `before` to `after` (canonical shapes or kinds), by path. A field renamed
/// is one path removed and one added; a kind that changed (JSON to `html`) is a retype of `$`.
pub fn diff(before: &str, after: &str) -> Vec<Change> {
    let (b, a) = (leaves(before), leaves(after));
    let paths: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    paths
        .into_iter()
        .filter(|p| b.get(*p) != a.get(*p))
        .map(|p| Change {
            path: p.clone(),
            before: b.get(p).cloned(),
            after: a.get(p).cloned(),
        })
        .collect()
}

/// Every leaf path of a shape with its type; a kind or an unreadable shape is `$`.
pub fn leaves(shape: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match serde_json::from_str::<serde_json::Value>(shape) {
        Ok(v) if is_json(shape) => walk(&v, "$".into(), &mut out),
        _ => {
            out.insert("$".into(), shape.to_string());
        }
    }
    out
}

fn walk(v: &serde_json::Value, path: String, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let step = if k.chars().all(|c| c.is_alphanumeric() || c == '_') && !k.is_empty() {
                    format!("{path}.{k}")
                } else {
                    format!("{path}[{}]", serde_json::Value::String(k.clone()))
                };
                walk(v, step, out);
            }
        }
        serde_json::Value::Object(_) => {
            out.insert(path, "object".into());
        }
        serde_json::Value::Array(a) => match a.first() {
            Some(e) => walk(e, format!("{path}[]"), out),
            None => {
                out.insert(path, "array".into());
            }
        },
        serde_json::Value::String(t) => {
            out.insert(path, t.clone());
        }
        other => {
            out.insert(path, other.to_string());
        }
    }
}

/// The leaf types, as bits of [`Node::Leaf`] in the order their names sort.
const LEAF_NAMES: [&str; 4] = ["boolean", "null", "number", "string"];
const BOOLEAN: u8 = 1;
const NULL: u8 = 2;
const NUMBER: u8 = 4;
const STRING: u8 = 8;

/// A shape while it is read. Keys are borrowed from the payload where it holds them as they
/// are (no escapes), and an object's fields are a vector sorted by key: reading a payload
/// allocates per object and array, not per key and leaf.
#[derive(Debug, Clone, PartialEq)]
enum Node<'de> {
    /// One or more leaf types (more when the elements of an array differ): bits of
    /// [`LEAF_NAMES`].
    Leaf(u8),
    /// An array, with the merge of its elements (`None`: empty).
    Array(Option<Box<Node<'de>>>),
    /// An object's fields, sorted by key, each key once (a map collapses to the key `*`).
    Object(Vec<(Cow<'de, str>, Node<'de>)>),
    /// Not described (too deep, too many).
    Elided,
    /// Elements of different structure (an object and an array in one array).
    Mixed(BTreeSet<String>),
}

impl<'de> Node<'de> {
    fn merge(self, other: Node<'de>) -> Node<'de> {
        match (self, other) {
            (Node::Leaf(a), Node::Leaf(b)) => Node::Leaf(a | b),
            (Node::Array(a), Node::Array(b)) => Node::Array(match (a, b) {
                (Some(a), Some(b)) => Some(Box::new(a.merge(*b))),
                (a, b) => a.or(b),
            }),
            (Node::Object(a), Node::Object(b)) => {
                // The union of the keys, both sorted; a key in both merges its values.
                let mut out = Vec::with_capacity(a.len().max(b.len()));
                let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
                loop {
                    let order = match (a.peek(), b.peek()) {
                        (Some((ka, _)), Some((kb, _))) => ka.as_ref().cmp(kb.as_ref()),
                        (Some(_), None) => std::cmp::Ordering::Less,
                        (None, Some(_)) => std::cmp::Ordering::Greater,
                        (None, None) => break,
                    };
                    match order {
                        std::cmp::Ordering::Less => out.extend(a.next()),
                        std::cmp::Ordering::Greater => out.extend(b.next()),
                        std::cmp::Ordering::Equal => {
                            if let (Some((k, va)), Some((_, vb))) = (a.next(), b.next()) {
                                out.push((k, va.merge(vb)));
                            }
                        }
                    }
                }
                Node::Object(out)
            }
            (Node::Elided, _) | (_, Node::Elided) => Node::Elided,
            (a, b) => {
                let mut set = BTreeSet::new();
                for n in [a, b] {
                    match n {
                        Node::Mixed(s) => set.extend(s),
                        n => {
                            set.insert(n.canonical());
                        }
                    }
                }
                Node::Mixed(set)
            }
        }
    }

    fn canonical(&self) -> String {
        let mut out = String::with_capacity(128);
        let mut budget = MAX_NODES;
        self.write(&mut out, &mut budget);
        out
    }

    fn write(&self, out: &mut String, budget: &mut usize) {
        if *budget == 0 {
            out.push_str("\"…\"");
            return;
        }
        *budget -= 1;
        match self {
            Node::Leaf(types) => {
                out.push('"');
                let mut first = true;
                for (bit, name) in LEAF_NAMES.iter().enumerate() {
                    if types & (1 << bit) != 0 {
                        if !first {
                            out.push('|');
                        }
                        first = false;
                        out.push_str(name);
                    }
                }
                out.push('"');
            }
            Node::Array(None) => out.push_str("[]"),
            Node::Array(Some(e)) => {
                out.push('[');
                e.write(out, budget);
                out.push(']');
            }
            Node::Object(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_key(out, k);
                    out.push(':');
                    v.write(out, budget);
                }
                out.push('}');
            }
            Node::Elided => out.push_str("\"…\""),
            Node::Mixed(set) => {
                // Structures that differ, as one string naming each.
                let joined = set.iter().cloned().collect::<Vec<_>>().join("|");
                let _ = write!(out, "{}", serde_json::Value::String(joined));
            }
        }
    }
}

/// Writes a key as a JSON string, escaped as serde_json escapes it.
fn write_key(out: &mut String, key: &str) {
    if key.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        let _ = write!(out, "{}", serde_json::Value::String(key.to_string()));
    } else {
        out.push('"');
        out.push_str(key);
        out.push('"');
    }
}

/// Reads one JSON value into its shape at `depth`.
struct Seed {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Seed {
    type Value = Node<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node<'de>, D::Error> {
        if self.depth > MAX_DEPTH {
            d.deserialize_ignored_any(IgnoredAny)?;
            return Ok(Node::Elided);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(BOOLEAN))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(NUMBER))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(NUMBER))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(NUMBER))
    }
    fn visit_str<E>(self, _: &str) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(STRING))
    }
    fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(STRING))
    }
    fn visit_string<E>(self, _: String) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(STRING))
    }
    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(NULL))
    }
    fn visit_none<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Leaf(NULL))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        let mut merged: Option<Node<'de>> = None;
        while let Some(n) = seq.next_element_seed(Seed {
            depth: self.depth + 1,
        })? {
            merged = Some(match merged {
                None => n,
                Some(m) if m == n => m,
                Some(m) => m.merge(n),
            });
        }
        Ok(Node::Array(merged.map(Box::new)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        let mut fields: Vec<(Cow<'de, str>, Node<'de>)> = Vec::new();
        let mut as_map: Option<Node<'de>> = None;
        while let Some(key) = map.next_key_seed(Key)? {
            let value = map.next_value_seed(Seed {
                depth: self.depth + 1,
            })?;
            if let Some(m) = as_map.take() {
                as_map = Some(m.merge(value));
                continue;
            }
            // A key given twice: the last one counts, as for serde_json.
            match fields.binary_search_by(|(k, _)| k.as_ref().cmp(key.as_ref())) {
                Ok(at) => fields[at].1 = value,
                Err(at) => fields.insert(at, (key, value)),
            }
            if fields.len() > MAX_KEYS {
                let mut values = std::mem::take(&mut fields).into_iter().map(|(_, v)| v);
                let first = values.next().unwrap_or(Node::Elided);
                as_map = Some(values.fold(first, Node::merge));
            }
        }
        Ok(match as_map {
            Some(m) => Node::Object(vec![(Cow::Borrowed("*"), m)]),
            None => Node::Object(fields),
        })
    }
}

/// Reads an object's key, borrowed from the payload when it is there as it is.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s))
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
