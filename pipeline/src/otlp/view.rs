//! A borrowed view of an OTLP trace request, read straight from the protobuf bytes.
//!
//! Decoding into prost's types allocates every key, value, name and id, and the pipeline
//! only reads them once. The view borrows strings and ids from the request bytes and keeps
//! attributes in one arena per request, so a request costs a handful of allocations instead
//! of tens per span. Nested array and key-value-list values stay as their (validated) bytes
//! and are read again only when rendered.
//!
//! The reader is deliberately conservative: it accepts a payload only when it can vouch that
//! prost reads it the same way (every field prost knows has the wire type prost expects,
//! strings are UTF-8, no singular message field is repeated, nesting is shallow, no groups).
//! Anything else is [`Fallback`]: the caller decodes with prost — which yields prost's error,
//! or prost's reading — and views that ([`Decoded::from_prost`]). Outputs are therefore the
//! same as decoding with prost, on every input.

use std::ops::Range;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

/// An attribute value.
#[derive(Clone, Copy, Debug)]
pub enum Val<'a> {
    /// `string_value`.
    Str(&'a str),
    /// `bool_value`.
    Bool(bool),
    /// `int_value`.
    Int(i64),
    /// `double_value`.
    Double(f64),
    /// `bytes_value`.
    Bytes(&'a [u8]),
    /// `string_value_strindex` (profiles only; rendered as null).
    Strindex,
    /// `array_value`.
    Array(List<'a>),
    /// `kvlist_value`.
    Kvlist(KvList<'a>),
}

/// The items of an array value.
#[derive(Clone, Copy, Debug)]
pub enum List<'a> {
    /// An `ArrayValue` message body, already validated.
    Wire(&'a [u8]),
    /// Decoded by prost.
    Prost(&'a [AnyValue]),
}

/// The pairs of a key-value-list value.
#[derive(Clone, Copy, Debug)]
pub enum KvList<'a> {
    /// A `KeyValueList` message body, already validated.
    Wire(&'a [u8]),
    /// Decoded by prost.
    Prost(&'a [KeyValue]),
}

/// A key and its value (`None` when the value or its oneof is absent).
#[derive(Clone, Copy, Debug)]
pub struct Kv<'a> {
    pub key: &'a str,
    pub value: Option<Val<'a>>,
}

/// A span's status.
#[derive(Clone, Copy, Debug, Default)]
pub struct Status<'a> {
    pub code: i32,
    pub message: &'a str,
}

/// A span event.
#[derive(Debug)]
pub struct Event<'a> {
    pub time_unix_nano: u64,
    pub name: &'a str,
    pub attributes: &'a [Kv<'a>],
}

/// A span, with the fields the pipeline reads.
#[derive(Debug)]
pub struct Span<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub parent_span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    pub attributes: &'a [Kv<'a>],
    pub events: &'a [Event<'a>],
    pub status: Option<Status<'a>>,
    /// Index of the span's `ResourceSpans` in the request.
    pub resource: usize,
    /// The name of the span's instrumentation scope (`""` when absent).
    pub scope: &'a str,
}

#[derive(Default)]
struct RawEvent<'a> {
    time_unix_nano: u64,
    name: &'a str,
    attributes: Range<usize>,
}

#[derive(Default)]
struct RawSpan<'a> {
    trace_id: &'a [u8],
    span_id: &'a [u8],
    parent_span_id: &'a [u8],
    name: &'a str,
    kind: i32,
    start_time_unix_nano: u64,
    end_time_unix_nano: u64,
    attributes: Range<usize>,
    events: Range<usize>,
    status: Option<Status<'a>>,
    resource: usize,
    scope: &'a str,
}

/// A request in arena form: every attribute in one vector, spans and events holding ranges.
#[derive(Default)]
pub struct Decoded<'a> {
    kvs: Vec<Kv<'a>>,
    events: Vec<RawEvent<'a>>,
    spans: Vec<RawSpan<'a>>,
    /// Resource attributes of each `ResourceSpans`, in request order.
    resources: Vec<Range<usize>>,
}

/// The fast reader cannot vouch for this payload; decode it with prost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback;

type R<T> = Result<T, Fallback>;

/// Nesting of array/kvlist values the fast reader accepts (prost's limit is 100 messages).
const MAX_NESTING: u32 = 32;

impl<'a> Decoded<'a> {
    /// Reads a protobuf `ExportTraceServiceRequest` (or `TracesData`).
    pub fn decode(bytes: &'a [u8]) -> Result<Decoded<'a>, Fallback> {
        let mut d = Decoded {
            kvs: Vec::with_capacity(bytes.len() / 40),
            events: Vec::new(),
            spans: Vec::with_capacity(bytes.len() / 200),
            resources: Vec::new(),
        };
        let mut r = Reader::new(bytes);
        let mut pending = Vec::new();
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => d.resource_spans(r.bytes(wt)?, &mut pending)?,
                _ => r.skip(wt)?,
            }
        }
        Ok(d)
    }

    /// Views a request prost decoded (OTLP/JSON, or protobuf the fast reader left to prost).
    pub fn from_prost(req: &'a ExportTraceServiceRequest) -> Decoded<'a> {
        let mut d = Decoded::default();
        for rs in &req.resource_spans {
            let ridx = d.resources.len();
            let start = d.kvs.len();
            if let Some(res) = &rs.resource {
                d.kvs.extend(res.attributes.iter().map(kv_from_prost));
            }
            d.resources.push(start..d.kvs.len());
            for ss in &rs.scope_spans {
                let scope = ss.scope.as_ref().map_or("", |sc| sc.name.as_str());
                for s in &ss.spans {
                    let a = d.kvs.len();
                    d.kvs.extend(s.attributes.iter().map(kv_from_prost));
                    let attributes = a..d.kvs.len();
                    let e = d.events.len();
                    for ev in &s.events {
                        let a = d.kvs.len();
                        d.kvs.extend(ev.attributes.iter().map(kv_from_prost));
                        d.events.push(RawEvent {
                            time_unix_nano: ev.time_unix_nano,
                            name: &ev.name,
                            attributes: a..d.kvs.len(),
                        });
                    }
                    d.spans.push(RawSpan {
                        trace_id: &s.trace_id,
                        span_id: &s.span_id,
                        parent_span_id: &s.parent_span_id,
                        name: &s.name,
                        kind: s.kind,
                        start_time_unix_nano: s.start_time_unix_nano,
                        end_time_unix_nano: s.end_time_unix_nano,
                        attributes,
                        events: e..d.events.len(),
                        status: s.status.as_ref().map(|st| Status {
                            code: st.code,
                            message: &st.message,
                        }),
                        resource: ridx,
                        scope,
                    });
                }
            }
        }
        d
    }

    /// Resource attributes of each `ResourceSpans`, in request order.
    pub fn resources(&self) -> Vec<&[Kv<'a>]> {
        self.resources
            .iter()
            .map(|r| &self.kvs[r.clone()])
            .collect()
    }

    /// The events, to be handed to [`Decoded::spans`].
    pub fn events(&self) -> Vec<Event<'_>> {
        self.events
            .iter()
            .map(|e| Event {
                time_unix_nano: e.time_unix_nano,
                name: e.name,
                attributes: &self.kvs[e.attributes.clone()],
            })
            .collect()
    }

    /// The spans in request order; `events` is [`Decoded::events`].
    pub fn spans<'s>(&'s self, events: &'s [Event<'s>]) -> Vec<Span<'s>> {
        self.spans
            .iter()
            .map(|s| Span {
                trace_id: s.trace_id,
                span_id: s.span_id,
                parent_span_id: s.parent_span_id,
                name: s.name,
                kind: s.kind,
                start_time_unix_nano: s.start_time_unix_nano,
                end_time_unix_nano: s.end_time_unix_nano,
                attributes: &self.kvs[s.attributes.clone()],
                events: &events[s.events.clone()],
                status: s.status,
                resource: s.resource,
                scope: s.scope,
            })
            .collect()
    }

    fn resource_spans(&mut self, body: &'a [u8], pending: &mut Vec<&'a [u8]>) -> R<()> {
        let ridx = self.resources.len();
        self.resources.push(0..0);
        let mut seen_resource = false;
        let mut r = Reader::new(body);
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => {
                    // prost merges a repeated singular message; leave that to prost.
                    if std::mem::replace(&mut seen_resource, true) {
                        return Err(Fallback);
                    }
                    let b = r.bytes(wt)?;
                    self.resources[ridx] = self.resource(b)?;
                }
                2 => self.scope_spans(r.bytes(wt)?, ridx, pending)?,
                3 => {
                    r.str(wt)?;
                }
                _ => r.skip(wt)?,
            }
        }
        Ok(())
    }

    fn resource(&mut self, body: &'a [u8]) -> R<Range<usize>> {
        let start = self.kvs.len();
        let mut r = Reader::new(body);
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => {
                    let kv = kv(r.bytes(wt)?, 0)?;
                    self.kvs.push(kv);
                }
                2 => {
                    r.varint_field(wt)?;
                }
                // Entity references: not read by toolspan, rare; prost validates them.
                3 => return Err(Fallback),
                _ => r.skip(wt)?,
            }
        }
        Ok(start..self.kvs.len())
    }

    fn scope_spans(&mut self, body: &'a [u8], ridx: usize, pending: &mut Vec<&'a [u8]>) -> R<()> {
        let mut r = Reader::new(body);
        let first = self.spans.len();
        let mut name = "";
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => name = scope(r.bytes(wt)?)?,
                2 => self.span(r.bytes(wt)?, ridx, pending)?,
                3 => {
                    r.str(wt)?;
                }
                _ => r.skip(wt)?,
            }
        }
        // The scope may follow its spans on the wire.
        if !name.is_empty() {
            for s in &mut self.spans[first..] {
                s.scope = name;
            }
        }
        Ok(())
    }

    fn span(&mut self, body: &'a [u8], ridx: usize, pending: &mut Vec<&'a [u8]>) -> R<()> {
        let mut s = RawSpan {
            resource: ridx,
            ..RawSpan::default()
        };
        let start = self.kvs.len();
        pending.clear();
        let mut r = Reader::new(body);
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => s.trace_id = r.bytes(wt)?,
                2 => s.span_id = r.bytes(wt)?,
                3 => {
                    r.str(wt)?;
                }
                4 => s.parent_span_id = r.bytes(wt)?,
                5 => s.name = r.str(wt)?,
                6 => s.kind = r.varint_field(wt)? as i32,
                7 => s.start_time_unix_nano = r.fixed64(wt)?,
                8 => s.end_time_unix_nano = r.fixed64(wt)?,
                9 => {
                    let kv = kv(r.bytes(wt)?, 0)?;
                    self.kvs.push(kv);
                }
                10 | 12 | 14 => {
                    r.varint_field(wt)?;
                }
                // Events are read after the span so its attributes stay contiguous.
                11 => pending.push(r.bytes(wt)?),
                13 => link(r.bytes(wt)?)?,
                15 => {
                    if s.status.is_some() {
                        return Err(Fallback);
                    }
                    s.status = Some(status(r.bytes(wt)?)?);
                }
                16 => {
                    r.fixed32(wt)?;
                }
                _ => r.skip(wt)?,
            }
        }
        s.attributes = start..self.kvs.len();
        let first_event = self.events.len();
        for &b in pending.iter() {
            let ev = self.event(b)?;
            self.events.push(ev);
        }
        s.events = first_event..self.events.len();
        self.spans.push(s);
        Ok(())
    }

    fn event(&mut self, body: &'a [u8]) -> R<RawEvent<'a>> {
        let mut ev = RawEvent::default();
        let start = self.kvs.len();
        let mut r = Reader::new(body);
        while let Some((tag, wt)) = r.key()? {
            match tag {
                1 => ev.time_unix_nano = r.fixed64(wt)?,
                2 => ev.name = r.str(wt)?,
                3 => {
                    let kv = kv(r.bytes(wt)?, 0)?;
                    self.kvs.push(kv);
                }
                4 => {
                    r.varint_field(wt)?;
                }
                _ => r.skip(wt)?,
            }
        }
        ev.attributes = start..self.kvs.len();
        Ok(ev)
    }
}

fn kv_from_prost(kv: &KeyValue) -> Kv<'_> {
    Kv {
        key: &kv.key,
        value: kv.value.as_ref().and_then(val_from_prost),
    }
}

fn val_from_prost(v: &AnyValue) -> Option<Val<'_>> {
    Some(match v.value.as_ref()? {
        Value::StringValue(s) => Val::Str(s),
        Value::BoolValue(b) => Val::Bool(*b),
        Value::IntValue(i) => Val::Int(*i),
        Value::DoubleValue(d) => Val::Double(*d),
        Value::BytesValue(b) => Val::Bytes(b),
        Value::StringValueStrindex(_) => Val::Strindex,
        Value::ArrayValue(a) => Val::Array(List::Prost(&a.values)),
        Value::KvlistValue(k) => Val::Kvlist(KvList::Prost(&k.values)),
    })
}

/// Reads an instrumentation scope; returns its name.
fn scope(body: &[u8]) -> R<&str> {
    let mut r = Reader::new(body);
    let mut name = "";
    while let Some((tag, wt)) = r.key()? {
        match tag {
            1 => name = r.str(wt)?,
            2 => {
                r.str(wt)?;
            }
            3 => {
                kv(r.bytes(wt)?, 0)?;
            }
            4 => {
                r.varint_field(wt)?;
            }
            _ => r.skip(wt)?,
        }
    }
    Ok(name)
}

fn link(body: &[u8]) -> R<()> {
    let mut r = Reader::new(body);
    while let Some((tag, wt)) = r.key()? {
        match tag {
            1 | 2 => {
                r.bytes(wt)?;
            }
            3 => {
                r.str(wt)?;
            }
            4 => {
                kv(r.bytes(wt)?, 0)?;
            }
            5 => {
                r.varint_field(wt)?;
            }
            6 => {
                r.fixed32(wt)?;
            }
            _ => r.skip(wt)?,
        }
    }
    Ok(())
}

fn status(body: &[u8]) -> R<Status<'_>> {
    let mut st = Status::default();
    let mut r = Reader::new(body);
    while let Some((tag, wt)) = r.key()? {
        match tag {
            2 => st.message = r.str(wt)?,
            3 => st.code = r.varint_field(wt)? as i32,
            _ => r.skip(wt)?,
        }
    }
    Ok(st)
}

/// Reads a `KeyValue` at nesting `depth`.
fn kv(body: &[u8], depth: u32) -> R<Kv<'_>> {
    let mut out = Kv {
        key: "",
        value: None,
    };
    let mut seen_value = false;
    let mut r = Reader::new(body);
    while let Some((tag, wt)) = r.key()? {
        match tag {
            1 => out.key = r.str(wt)?,
            2 => {
                if std::mem::replace(&mut seen_value, true) {
                    return Err(Fallback);
                }
                out.value = any_value(r.bytes(wt)?, depth)?;
            }
            3 => {
                r.varint_field(wt)?;
            }
            _ => r.skip(wt)?,
        }
    }
    Ok(out)
}

/// Reads an `AnyValue`; nested arrays and lists are validated and kept as bytes.
fn any_value(body: &[u8], depth: u32) -> R<Option<Val<'_>>> {
    if depth > MAX_NESTING {
        return Err(Fallback);
    }
    let mut out = None;
    let mut r = Reader::new(body);
    while let Some((tag, wt)) = r.key()? {
        let v = match tag {
            1 => Val::Str(r.str(wt)?),
            2 => Val::Bool(r.varint_field(wt)? != 0),
            3 => Val::Int(r.varint_field(wt)? as i64),
            4 => Val::Double(f64::from_bits(r.fixed64(wt)?)),
            5 => {
                let b = r.bytes(wt)?;
                for item in Items::new(b, 1) {
                    any_value(item?, depth + 1)?;
                }
                Val::Array(List::Wire(b))
            }
            6 => {
                let b = r.bytes(wt)?;
                for item in Items::new(b, 1) {
                    kv(item?, depth + 1)?;
                }
                Val::Kvlist(KvList::Wire(b))
            }
            7 => Val::Bytes(r.bytes(wt)?),
            8 => {
                r.varint_field(wt)?;
                Val::Strindex
            }
            _ => {
                r.skip(wt)?;
                continue;
            }
        };
        // A oneof set twice: prost keeps the last or merges messages; leave that to prost.
        if out.replace(v).is_some() {
            return Err(Fallback);
        }
    }
    Ok(out)
}

impl<'a> List<'a> {
    /// The items (`None` for an item without a value).
    pub fn for_each(&self, mut f: impl FnMut(Option<Val<'a>>) -> bool) {
        match *self {
            List::Wire(b) => {
                for item in Items::new(b, 1) {
                    // Validated when read, so neither step can fail here.
                    let Ok(v) = item.and_then(|i| any_value(i, 0)) else {
                        return;
                    };
                    if !f(v) {
                        return;
                    }
                }
            }
            List::Prost(items) => {
                for item in items {
                    if !f(val_from_prost(item)) {
                        return;
                    }
                }
            }
        }
    }
}

impl<'a> KvList<'a> {
    /// The pairs.
    pub fn for_each(&self, mut f: impl FnMut(Kv<'a>)) {
        match *self {
            KvList::Wire(b) => {
                for item in Items::new(b, 1) {
                    // Validated when read, so neither step can fail here.
                    let Ok(kv) = item.and_then(|i| kv(i, 0)) else {
                        return;
                    };
                    f(kv);
                }
            }
            KvList::Prost(items) => items.iter().for_each(|kv| f(kv_from_prost(kv))),
        }
    }
}

/// The bodies of a message's length-delimited field `tag`, other fields skipped.
struct Items<'a> {
    r: Reader<'a>,
    tag: u32,
}

impl<'a> Items<'a> {
    fn new(body: &'a [u8], tag: u32) -> Items<'a> {
        Items {
            r: Reader::new(body),
            tag,
        }
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = R<&'a [u8]>;

    fn next(&mut self) -> Option<R<&'a [u8]>> {
        loop {
            let (tag, wt) = match self.r.key() {
                Ok(Some(k)) => k,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            if tag == self.tag {
                return Some(self.r.bytes(wt));
            }
            if let Err(e) = self.r.skip(wt) {
                return Some(Err(e));
            }
        }
    }
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// Protobuf wire reading over a byte slice; anything prost would reject is a [`Fallback`].
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    #[inline]
    fn varint(&mut self) -> R<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(Fallback)?;
            self.pos += 1;
            // prost rejects a tenth byte above 1 (more than 64 bits).
            if i == 9 && b > 1 {
                return Err(Fallback);
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(Fallback)
    }

    /// The next field's (tag, wire type), or `None` at the end of the message.
    #[inline]
    fn key(&mut self) -> R<Option<(u32, u8)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let (tag, wt) = (k >> 3, (k & 7) as u8);
        if k > u64::from(u32::MAX) || tag == 0 {
            return Err(Fallback);
        }
        Ok(Some((tag as u32, wt)))
    }

    #[inline]
    fn bytes(&mut self, wt: u8) -> R<&'a [u8]> {
        if wt != LEN {
            return Err(Fallback);
        }
        let len = usize::try_from(self.varint()?).map_err(|_| Fallback)?;
        let end = self.pos.checked_add(len).ok_or(Fallback)?;
        let b = self.buf.get(self.pos..end).ok_or(Fallback)?;
        self.pos = end;
        Ok(b)
    }

    #[inline]
    fn str(&mut self, wt: u8) -> R<&'a str> {
        std::str::from_utf8(self.bytes(wt)?).map_err(|_| Fallback)
    }

    #[inline]
    fn varint_field(&mut self, wt: u8) -> R<u64> {
        if wt != VARINT {
            return Err(Fallback);
        }
        self.varint()
    }

    #[inline]
    fn fixed64(&mut self, wt: u8) -> R<u64> {
        if wt != FIXED64 {
            return Err(Fallback);
        }
        let b: [u8; 8] = self
            .buf
            .get(self.pos..self.pos + 8)
            .ok_or(Fallback)?
            .try_into()
            .map_err(|_| Fallback)?;
        self.pos += 8;
        Ok(u64::from_le_bytes(b))
    }

    #[inline]
    fn fixed32(&mut self, wt: u8) -> R<u32> {
        if wt != FIXED32 {
            return Err(Fallback);
        }
        let b: [u8; 4] = self
            .buf
            .get(self.pos..self.pos + 4)
            .ok_or(Fallback)?
            .try_into()
            .map_err(|_| Fallback)?;
        self.pos += 4;
        Ok(u32::from_le_bytes(b))
    }

    /// Skips a field prost does not know (groups are left to prost).
    fn skip(&mut self, wt: u8) -> R<()> {
        match wt {
            VARINT => self.varint().map(drop),
            FIXED64 => self.fixed64(wt).map(drop),
            LEN => self.bytes(wt).map(drop),
            FIXED32 => self.fixed32(wt).map(drop),
            _ => Err(Fallback),
        }
    }
}

#[cfg(test)]
mod tests;
