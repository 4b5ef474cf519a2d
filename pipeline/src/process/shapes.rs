//! The shape columns (`input_shape`, `output_shape` and their documents): the shape of each
//! payload, taken once per payload from its full body after redaction, before the stored text
//! is cut to its first 4 KiB. Redacted first, so that a secret used as a key never reaches
//! the shape document.

use std::sync::Arc;

use arrow::array::{ArrayRef, StringBuilder};
use toolspan_schema::shape;

/// Builders of the four shape columns, by direction (0: input, 1: output).
pub struct ShapeColumns {
    ids: [StringBuilder; 2],
    docs: [StringBuilder; 2],
    /// Off: every value is null ([`crate::Pipeline::with_shapes`]).
    on: bool,
}

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

impl ShapeColumns {
    /// Builders sized for `n` rows; `on: false` leaves every value null.
    pub fn with_capacity(n: usize, on: bool) -> ShapeColumns {
        let s = |bytes: usize| StringBuilder::with_capacity(n, if on { n * bytes } else { 0 });
        ShapeColumns {
            ids: [s(8), s(8)],
            docs: [s(32), s(32)],
            on,
        }
    }

    /// Appends the shape of one payload of direction `dir` (0: input, 1: output); `None`: the
    /// span has no such payload.
    pub fn append(&mut self, dir: usize, body: Option<&str>) {
        match body.filter(|_| self.on) {
            Some(body) => {
                let (id, doc) = shape_of(body);
                self.ids[dir].append_value(&id);
                self.docs[dir].append_value(&doc);
            }
            None => {
                self.ids[dir].append_null();
                self.docs[dir].append_null();
            }
        }
    }

    /// The columns in schema order: `input_shape`, `output_shape`, `input_shape_doc`,
    /// `output_shape_doc`.
    pub fn finish(&mut self) -> [ArrayRef; 4] {
        let [ii, oi] = &mut self.ids;
        let [id, od] = &mut self.docs;
        [
            Arc::new(ii.finish()),
            Arc::new(oi.finish()),
            Arc::new(id.finish()),
            Arc::new(od.finish()),
        ]
    }
}
