//! The shape columns (`input_shape`, `output_shape` and their documents): the shape of each
//! payload, taken once per payload from its full body after redaction, before the stored text
//! is cut to its first 4 KiB. Redacted first, so that a secret used as a key never reaches
//! the shape document.
//!
//! Tools answer the same text again and again (the same search, the same "ok"): within a
//! batch, a payload's shape is taken once per distinct text, and each row refers to it. The
//! columns are built from those references when the batch is finished.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray, StringBuilder};
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

/// Payloads longer than this are not remembered by their text (rarely repeated, and their
/// copies would cost more than their shapes).
const CACHED_TEXT: usize = 4096;
/// At most this many bytes of payload text are remembered per batch.
const CACHED_BYTES: usize = 1 << 20;

/// A row without this payload.
const NONE: u32 = u32::MAX;

/// The four shape columns of a batch, by direction (0: input, 1: output).
pub struct ShapeColumns {
    /// Per direction, per row: the index of its shape in `shapes`, or [`NONE`].
    rows: [Vec<u32>; 2],
    /// Per direction, whether any row has a payload.
    any: [bool; 2],
    /// The shapes taken: (id, document).
    shapes: Vec<(String, String)>,
    /// Payload texts seen in this batch and their shapes' indices.
    seen: HashMap<Box<str>, u32, foldhash::fast::RandomState>,
    /// Bytes of text in `seen`.
    seen_bytes: usize,
    /// Off: every value is null ([`crate::Pipeline::with_shapes`]).
    on: bool,
}

impl ShapeColumns {
    /// Columns sized for `n` rows; `on: false` leaves every value null.
    pub fn with_capacity(n: usize, on: bool) -> ShapeColumns {
        ShapeColumns {
            rows: [Vec::with_capacity(n), Vec::with_capacity(n)],
            any: [false; 2],
            shapes: Vec::new(),
            seen: HashMap::default(),
            seen_bytes: 0,
            on,
        }
    }

    /// Appends the shape of one payload of direction `dir` (0: input, 1: output); `None`: the
    /// span has no such payload.
    #[inline]
    pub fn append(&mut self, dir: usize, body: Option<&str>) {
        let at = match body.filter(|_| self.on) {
            Some(body) => {
                self.any[dir] = true;
                self.shape(body)
            }
            None => NONE,
        };
        self.rows[dir].push(at);
    }

    /// The index of `body`'s shape in `shapes`, taken now unless the same text was seen.
    fn shape(&mut self, body: &str) -> u32 {
        if let Some(&at) = self.seen.get(body) {
            return at;
        }
        let at = u32::try_from(self.shapes.len()).unwrap_or(NONE - 1);
        self.shapes.push(shape_of(body));
        if body.len() <= CACHED_TEXT && self.seen_bytes + body.len() <= CACHED_BYTES {
            self.seen_bytes += body.len();
            self.seen.insert(body.into(), at);
        }
        at
    }

    /// The columns in schema order: `input_shape`, `output_shape`, `input_shape_doc`,
    /// `output_shape_doc`. The builder is empty afterwards.
    pub fn finish(&mut self) -> [ArrayRef; 4] {
        let column = |dir: usize, part: fn(&(String, String)) -> &str| -> ArrayRef {
            let rows = &self.rows[dir];
            if !self.any[dir] {
                return Arc::new(StringArray::new_null(rows.len()));
            }
            let bytes = rows
                .iter()
                .filter(|&&r| r != NONE)
                .map(|&r| part(&self.shapes[r as usize]).len())
                .sum();
            let mut b = StringBuilder::with_capacity(rows.len(), bytes);
            for &r in rows {
                match self.shapes.get(r as usize) {
                    Some(s) => b.append_value(part(s)),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        };
        let cols = if self.any == [false; 2] {
            // No payload in the batch: one array of nulls serves all four columns.
            let nulls: ArrayRef = Arc::new(StringArray::new_null(self.rows[0].len()));
            [nulls.clone(), nulls.clone(), nulls.clone(), nulls]
        } else {
            [
                column(0, shape_id),
                column(1, shape_id),
                column(0, shape_doc),
                column(1, shape_doc),
            ]
        };
        for r in &mut self.rows {
            r.clear();
        }
        self.any = [false; 2];
        self.shapes.clear();
        self.seen.clear();
        self.seen_bytes = 0;
        cols
    }
}

fn shape_id(s: &(String, String)) -> &str {
    &s.0
}

fn shape_doc(s: &(String, String)) -> &str {
    &s.1
}
