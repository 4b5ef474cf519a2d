//! The first implementation of [`super::of_text`] (a `BTreeMap` of owned keys per object, a
//! `BTreeSet` per leaf), kept to check that the faster one gives the very same canonical
//! forms.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

use super::{kind_of, starts_like_json, MAX_DEPTH, MAX_KEYS, MAX_NODES};

/// [`super::of_text`] as it was first written.
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

/// A shape while it is read.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// One or more leaf types (more when the elements of an array differ).
    Leaf(BTreeSet<&'static str>),
    /// An array, with the merge of its elements (`None`: empty).
    Array(Option<Box<Node>>),
    /// An object by key (a map collapses to the key `*`).
    Object(BTreeMap<String, Node>),
    /// Not described (too deep, too many).
    Elided,
    /// Elements of different structure (an object and an array in one array).
    Mixed(BTreeSet<String>),
}

impl Node {
    fn leaf(t: &'static str) -> Node {
        Node::Leaf(BTreeSet::from([t]))
    }

    fn merge(self, other: Node) -> Node {
        match (self, other) {
            (Node::Leaf(mut a), Node::Leaf(b)) => {
                a.extend(b);
                Node::Leaf(a)
            }
            (Node::Array(a), Node::Array(b)) => Node::Array(match (a, b) {
                (Some(a), Some(b)) => Some(Box::new(a.merge(*b))),
                (a, b) => a.or(b),
            }),
            (Node::Object(mut a), Node::Object(b)) => {
                for (k, v) in b {
                    let merged = match a.remove(&k) {
                        Some(old) => old.merge(v),
                        None => v,
                    };
                    a.insert(k, merged);
                }
                Node::Object(a)
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
        let mut out = String::new();
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
                for (i, t) in types.iter().enumerate() {
                    if i > 0 {
                        out.push('|');
                    }
                    out.push_str(t);
                }
                out.push('"');
            }
            Node::Array(None) => out.push_str("[]"),
            Node::Array(Some(e)) => {
                out.push('[');
                e.write(out, budget);
                out.push(']');
            }
            Node::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}:", serde_json::Value::String(k.clone()));
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

/// Reads one JSON value into its shape at `depth`.
struct Seed {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Seed {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        if self.depth > MAX_DEPTH {
            d.deserialize_ignored_any(IgnoredAny)?;
            return Ok(Node::Elided);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::leaf("boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::leaf("number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::leaf("number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::leaf("number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::leaf("string"))
    }
    fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Node, E> {
        Ok(Node::leaf("string"))
    }
    fn visit_string<E>(self, _: String) -> Result<Node, E> {
        Ok(Node::leaf("string"))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::leaf("null"))
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::leaf("null"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut merged: Option<Node> = None;
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

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut fields: BTreeMap<String, Node> = BTreeMap::new();
        let mut as_map: Option<Node> = None;
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Seed {
                depth: self.depth + 1,
            })?;
            if let Some(m) = as_map.take() {
                as_map = Some(m.merge(value));
                continue;
            }
            // A key given twice: the last one counts, as for serde_json.
            fields.insert(key, value);
            if fields.len() > MAX_KEYS {
                let mut values = std::mem::take(&mut fields).into_values();
                let first = values.next().unwrap_or(Node::Elided);
                as_map = Some(values.fold(first, Node::merge));
            }
        }
        Ok(match as_map {
            Some(m) => Node::Object(BTreeMap::from([("*".to_string(), m)])),
            None => Node::Object(fields),
        })
    }
}
