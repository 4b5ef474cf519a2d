//! The shape columns (`input_shape`, `output_shape` and their documents): the shape of each
//! payload, taken once per payload from its full body after redaction, before the stored text
//! is cut to its first 4 KiB. Redacted first, so that a secret used as a key never reaches
//! the shape document.
//!
//! Tools answer the same text again and again (the same search, the same "ok"): within a
//! batch, a payload's shape is taken once per distinct payload (known by the SHA-256 the row
//! stores anyway), and each row refers to it. The columns are taken from those references
//! when the batch is finished.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayBuilder, ArrayRef, StringArray, StringBuilder, UInt32Array};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::take;
use toolspan_schema::shape;

/// A payload's shape id and document: for JSON, 16 hex digits naming the canonical form; for
/// anything else, its kind (`empty`, `html`, `binary`, `text`) for both.
pub fn shape_of(body: &str) -> (String, String) {
    let doc = shape::of_text(body);
    let id = if shape::is_json(&doc) {
        shape::id(&doc)
    } else {
        doc.clone()
    };
    (id, doc)
}

/// At most this many distinct payloads are remembered per batch.
const SEEN: usize = 1 << 16;
/// A row without this payload.
const NONE: u32 = u32::MAX;

/// The four shape columns of a batch, by direction (0: input, 1: output).
pub struct ShapeColumns {
    /// Per direction, per row: the index of its shape in `ids` and `docs`, or [`NONE`].
    rows: [Vec<u32>; 2],
    /// Per direction, whether any row has a payload.
    any: [bool; 2],
    /// The shapes taken, by index: ids and documents.
    ids: StringBuilder,
    docs: StringBuilder,
    /// Payloads seen in this batch, by the first 16 bytes of their SHA-256 (taken for the
    /// `*_sha256` columns anyway), and their shapes' indices.
    seen: HashMap<u128, u32, foldhash::fast::RandomState>,
    /// Off: every value is null ([`crate::Pipeline::with_shapes`]).
    on: bool,
}

impl ShapeColumns {
    /// Columns sized for `n` rows; `on: false` leaves every value null.
    pub fn with_capacity(n: usize, on: bool) -> ShapeColumns {
        ShapeColumns {
            rows: [Vec::with_capacity(n), Vec::with_capacity(n)],
            any: [false; 2],
            ids: StringBuilder::new(),
            docs: StringBuilder::new(),
            seen: HashMap::default(),
            on,
        }
    }

    /// Appends the shape of one payload of direction `dir` (0: input, 1: output), given with
    /// its SHA-256; `None`: the span has no such payload.
    #[inline]
    pub fn append(&mut self, dir: usize, body: Option<(&str, &[u8])>) {
        let at = match body.filter(|_| self.on) {
            Some((body, sha256)) => {
                self.any[dir] = true;
                self.shape(body, sha256)
            }
            None => NONE,
        };
        self.rows[dir].push(at);
    }

    /// The index of `body`'s shape, taken now unless the same payload was seen.
    fn shape(&mut self, body: &str, sha256: &[u8]) -> u32 {
        let key = sha256
            .get(..16)
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(u128::from_le_bytes);
        if let Some(at) = key.and_then(|k| self.seen.get(&k)) {
            return *at;
        }
        let at = u32::try_from(self.ids.len()).unwrap_or(NONE - 1);
        let (id, doc) = shape_of(body);
        self.ids.append_value(id);
        self.docs.append_value(doc);
        if let Some(k) = key.filter(|_| self.seen.len() < SEEN) {
            self.seen.insert(k, at);
        }
        at
    }

    /// The columns in schema order: `input_shape`, `output_shape`, `input_shape_doc`,
    /// `output_shape_doc`, each taken from the distinct shapes by the rows' indices. The
    /// builder is empty afterwards.
    pub fn finish(&mut self) -> [ArrayRef; 4] {
        let n = self.rows[0].len();
        let cols = if self.any == [false; 2] {
            // No payload in the batch: one array of nulls serves all four columns.
            let nulls: ArrayRef = Arc::new(StringArray::new_null(n));
            [nulls.clone(), nulls.clone(), nulls.clone(), nulls]
        } else {
            let ids = self.ids.finish();
            let docs = self.docs.finish();
            let any = self.any;
            let mut indices = |dir: usize| -> Option<UInt32Array> {
                if !any[dir] {
                    return None;
                }
                let mut rows = std::mem::take(&mut self.rows[dir]);
                let valid =
                    NullBuffer::from(BooleanBuffer::collect_bool(rows.len(), |i| rows[i] != NONE));
                // A null row's index is never read; 0 keeps every index in bounds.
                for r in &mut rows {
                    if *r == NONE {
                        *r = 0;
                    }
                }
                Some(UInt32Array::new(rows.into(), Some(valid)))
            };
            let pick = |from: &StringArray, at: &Option<UInt32Array>| -> ArrayRef {
                match at {
                    Some(at) => {
                        take(from, at, None).unwrap_or_else(|_| Arc::new(StringArray::new_null(n)))
                    }
                    None => Arc::new(StringArray::new_null(n)),
                }
            };
            let (input, output) = (indices(0), indices(1));
            [
                pick(&ids, &input),
                pick(&ids, &output),
                pick(&docs, &input),
                pick(&docs, &output),
            ]
        };
        for r in &mut self.rows {
            r.clear();
        }
        self.any = [false; 2];
        self.seen.clear();
        cols
    }
}
