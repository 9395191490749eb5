//! GGUF (version 3) metadata: reading a file's header (key-values and tensor infos) and writing a
//! header whose tensor data follows. Tensor bytes are streamed by the caller.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value. Arrays hold values of one type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    fn from_u32(v: u32) -> Result<ValueType> {
        use ValueType::*;
        Ok(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => bail!("unknown GGUF value type {v}"),
        })
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    #[cfg(test)]
    pub fn strings(items: impl IntoIterator<Item = String>) -> Value {
        Value::Array(
            ValueType::String,
            items.into_iter().map(Value::String).collect(),
        )
    }
}

/// One tensor's entry in the header. `offset` is relative to the start of the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: dims[0] is the contiguous dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub kv: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
}

impl Header {
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

// ---- reading ----

fn read_exact<const N: usize>(r: &mut impl Read) -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf).context("unexpected end of file")?;
    Ok(buf)
}

fn read_u32(r: &mut impl Read) -> Result<u32> {
    Ok(u32::from_le_bytes(read_exact(r)?))
}

fn read_u64(r: &mut impl Read) -> Result<u64> {
    Ok(u64::from_le_bytes(read_exact(r)?))
}

fn read_string(r: &mut impl Read) -> Result<String> {
    let len = read_u64(r)?;
    if len > 1 << 30 {
        bail!("string of {len} bytes: not a GGUF file?");
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)
        .context("unexpected end of file in a string")?;
    String::from_utf8(buf).context("string is not UTF-8")
}

fn read_value(r: &mut impl Read, t: ValueType) -> Result<Value> {
    Ok(match t {
        ValueType::U8 => Value::U8(read_exact::<1>(r)?[0]),
        ValueType::I8 => Value::I8(read_exact::<1>(r)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(read_exact(r)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(read_exact(r)?)),
        ValueType::U32 => Value::U32(read_u32(r)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(read_exact(r)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(read_exact(r)?)),
        ValueType::Bool => Value::Bool(read_exact::<1>(r)?[0] != 0),
        ValueType::String => Value::String(read_string(r)?),
        ValueType::Array => {
            let elem = ValueType::from_u32(read_u32(r)?)?;
            let n = read_u64(r)?;
            if n > 1 << 28 {
                bail!("array of {n} elements: not a GGUF file?");
            }
            let items = (0..n)
                .map(|_| read_value(r, elem))
                .collect::<Result<Vec<_>>>()?;
            Value::Array(elem, items)
        }
        ValueType::U64 => Value::U64(read_u64(r)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(read_exact(r)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(read_exact(r)?)),
    })
}

/// Reads the header (metadata and tensor infos) of a GGUF file.
pub fn read_header(path: &Path) -> Result<Header> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(file);
    let parse = |r: &mut BufReader<std::fs::File>| -> Result<Header> {
        if &read_exact::<4>(r)? != MAGIC {
            bail!("not a GGUF file (bad magic)");
        }
        let version = read_u32(r)?;
        if version != VERSION {
            bail!("GGUF version {version}; only version {VERSION} is read");
        }
        let n_tensors = read_u64(r)?;
        let n_kv = read_u64(r)?;
        let mut kv = Vec::new();
        for _ in 0..n_kv {
            let key = read_string(r)?;
            let t = ValueType::from_u32(read_u32(r)?)?;
            kv.push((key, read_value(r, t)?));
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = read_string(r)?;
            let n_dims = read_u32(r)?;
            let dims = (0..n_dims)
                .map(|_| read_u64(r))
                .collect::<Result<Vec<_>>>()?;
            let ggml_type = read_u32(r)?;
            let offset = read_u64(r)?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        Ok(Header { kv, tensors })
    };
    parse(&mut r).with_context(|| format!("reading the GGUF header of {}", path.display()))
}

// ---- writing ----

fn write_string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_string(w, s),
        Value::Array(t, items) => {
            w.write_all(&(*t as u32).to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|item| write_value(w, item))
        }
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

pub fn align(offset: u64, alignment: u64) -> u64 {
    offset.div_ceil(alignment) * alignment
}

/// Writes the header and the padding up to the data section. Tensor offsets must already be
/// aligned (see [`layout`]). Returns the number of bytes written.
pub fn write_header(w: &mut impl Write, header: &Header) -> Result<u64> {
    let mut out = CountingWriter { inner: w, count: 0 };
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&(header.tensors.len() as u64).to_le_bytes())?;
    out.write_all(&(header.kv.len() as u64).to_le_bytes())?;
    for (key, value) in &header.kv {
        write_string(&mut out, key)?;
        out.write_all(&(value.value_type() as u32).to_le_bytes())?;
        write_value(&mut out, value)?;
    }
    for t in &header.tensors {
        write_string(&mut out, &t.name)?;
        out.write_all(&(t.dims.len() as u32).to_le_bytes())?;
        for d in &t.dims {
            out.write_all(&d.to_le_bytes())?;
        }
        out.write_all(&t.ggml_type.to_le_bytes())?;
        out.write_all(&t.offset.to_le_bytes())?;
    }
    let padding = align(out.count, DEFAULT_ALIGNMENT) - out.count;
    out.write_all(&vec![0u8; padding as usize])?;
    Ok(out.count)
}

/// Assigns aligned data offsets to tensors of the given byte sizes; returns the data section size.
pub fn layout(tensors: &mut [TensorInfo], sizes: &[u64]) -> u64 {
    let mut offset = 0;
    for (t, size) in tensors.iter_mut().zip(sizes) {
        t.offset = offset;
        offset = align(offset + size, DEFAULT_ALIGNMENT);
    }
    offset
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let mut tensors = vec![
            TensorInfo {
                name: "a".into(),
                dims: vec![4, 2],
                ggml_type: 0,
                offset: 0,
            },
            TensorInfo {
                name: "blk.0.b".into(),
                dims: vec![256],
                ggml_type: 12,
                offset: 0,
            },
        ];
        let data = layout(&mut tensors, &[32, 144]);
        assert_eq!((tensors[0].offset, tensors[1].offset, data), (0, 32, 192));
        let header = Header {
            kv: vec![
                (
                    "general.architecture".into(),
                    Value::String("qwen35moe".into()),
                ),
                ("x.count".into(), Value::U32(40)),
                ("x.eps".into(), Value::F32(1e-6)),
                (
                    "x.sections".into(),
                    Value::Array(ValueType::I32, vec![Value::I32(11), Value::I32(0)]),
                ),
                (
                    "x.tokens".into(),
                    Value::strings(["a".to_owned(), "bc".to_owned()]),
                ),
                ("x.flag".into(), Value::Bool(true)),
            ],
            tensors,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let mut bytes = Vec::new();
        let n = write_header(&mut bytes, &header).unwrap();
        assert_eq!(n as usize, bytes.len());
        assert_eq!(bytes.len() % DEFAULT_ALIGNMENT as usize, 0);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_header(&path).unwrap(), header);

        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(read_header(&path).is_err());
        std::fs::write(&path, b"GGML....").unwrap();
        assert!(format!("{:#}", read_header(&path).unwrap_err()).contains("bad magic"));
    }
}
