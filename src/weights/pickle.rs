//! A restricted pickle reader: it interprets the opcodes `torch.save` emits (protocol 2, and the
//! protocol 0-4 opcodes a state dict can contain) into plain [`Value`]s, and executes nothing.
//!
//! Globals are an allow-list ([`Global`]): the functions that rebuild tensors and parameters, the typed
//! storage classes and `collections.OrderedDict`. Any other `module.name` is refused by name
//! ([`Error::PickleGlobal`]) the moment it is pushed, before anything could call it. Opcodes that
//! instantiate arbitrary classes (`INST`, `OBJ`, `NEWOBJ`, extension registries, out-of-band buffers)
//! are refused by name too. `REDUCE` only applies an allowed global, and builds a value from its
//! arguments ([`crate::weights::torch`] turns them into tensor descriptors).
//!
//! Bounds: the input length (`MAX_PICKLE_LEN`), stack and mark depth, memo size, nesting depth, string
//! lengths, and a work budget proportional to the input (values are shared, `Rc`, on memo reads and
//! copied only when a shared list or dict is mutated; each copy spends budget), so memory stays linear
//! in the input.

use std::rc::Rc;

use crate::error::{Error, Result};
use crate::weights::header::StDtype;

/// Largest pickle we interpret (a base model's `data.pkl` is ~50 KB).
pub const MAX_PICKLE_LEN: usize = 64 << 20;
/// Deepest value stack (torch's stays below 10).
const MAX_STACK: usize = 1 << 16;
/// Most memo entries.
const MAX_MEMO: usize = 1 << 20;
/// Deepest container nesting.
const MAX_DEPTH: u32 = 64;
/// Longest string or bytes object.
const MAX_STR: usize = 1 << 20;
/// Work budget: `BUDGET_PER_BYTE` per input byte plus this (elements created or copied).
const BUDGET_BASE: u64 = 1 << 16;
const BUDGET_PER_BYTE: u64 = 2;

/// The globals a torch checkpoint may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Global {
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_parameter`.
    RebuildParameter,
    /// A typed storage class (`torch.FloatStorage`, ...), by its element type.
    Storage(StDtype),
}

impl Global {
    /// The allow-list: `module.name` -> global.
    pub fn lookup(module: &str, name: &str) -> Option<Global> {
        Some(match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
            ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
            ("torch", storage) => Global::Storage(storage_dtype(storage)?),
            _ => return None,
        })
    }
}

/// The element type of a typed storage class name.
fn storage_dtype(name: &str) -> Option<StDtype> {
    Some(match name {
        "FloatStorage" => StDtype::F32,
        "HalfStorage" => StDtype::F16,
        "BFloat16Storage" => StDtype::BF16,
        "DoubleStorage" => StDtype::F64,
        "LongStorage" => StDtype::I64,
        "IntStorage" => StDtype::I32,
        "ShortStorage" => StDtype::I16,
        "CharStorage" => StDtype::I8,
        "ByteStorage" => StDtype::U8,
        "BoolStorage" => StDtype::Bool,
        _ => return None,
    })
}

/// A list, tuple or dict (dict items flattened as key, value, key, value, ...).
#[derive(Clone, Debug)]
pub struct Items {
    pub items: Rc<Vec<Value>>,
    depth: u32,
}

impl Items {
    fn new(items: Vec<Value>) -> Result<Items, String> {
        let depth = 1 + items.iter().map(Value::depth).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        Ok(Items {
            items: Rc::new(items),
            depth,
        })
    }
}

/// A value the reader builds. `Reduced` holds an allowed global applied to its arguments, interpreted
/// later ([`crate::weights::torch`]); `PersId` a persistent id (a torch storage reference).
#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Items),
    List(Items),
    Dict(Items),
    OrderedDict(Items),
    Global(Global),
    Reduced(Global, Items),
    PersId(Box<Value>),
}

impl Value {
    fn depth(&self) -> u32 {
        match self {
            Value::Tuple(i) | Value::List(i) | Value::Dict(i) | Value::OrderedDict(i) => i.depth,
            Value::Reduced(_, i) => i.depth + 1,
            Value::PersId(v) => v.depth() + 1,
            _ => 0,
        }
    }

    /// A short name of the value's kind for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::OrderedDict(_) => "OrderedDict",
            Value::Global(_) => "global",
            Value::Reduced(..) => "reduced object",
            Value::PersId(_) => "persistent id",
        }
    }
}

/// The outcome of reading a prefix of a pickle.
#[derive(Debug)]
pub enum Parsed {
    /// `STOP` reached: the value and the bytes the pickle used.
    Done(Value, usize),
    /// The input ended before `STOP`.
    NeedMore,
}

/// Read one pickle from the start of `data` (which may hold more bytes after it). `file` names the
/// source in errors.
pub fn read_pickle(data: &[u8], file: &str) -> Result<Parsed> {
    let mut m = Machine::new(data, file);
    match m.run() {
        Ok(v) => Ok(Parsed::Done(v, m.pos)),
        Err(Stop::NeedMore) => {
            if data.len() >= MAX_PICKLE_LEN {
                return Err(m.err(format!("longer than {MAX_PICKLE_LEN} bytes")));
            }
            Ok(Parsed::NeedMore)
        }
        Err(Stop::Fail(e)) => Err(e),
    }
}

enum Stop {
    NeedMore,
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Fail(e)
    }
}

type Step<T> = std::result::Result<T, Stop>;

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    file: &'a str,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: std::collections::BTreeMap<u64, Value>,
    budget: u64,
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8], file: &'a str) -> Self {
        let len = data.len().min(MAX_PICKLE_LEN) as u64;
        Machine {
            data: &data[..len as usize],
            pos: 0,
            file,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: std::collections::BTreeMap::new(),
            budget: BUDGET_BASE + BUDGET_PER_BYTE * len,
        }
    }

    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Pickle {
            file: self.file.to_owned(),
            msg: format!("at byte {}: {}", self.pos, msg.into()),
        }
    }

    fn fail<T>(&self, msg: impl Into<String>) -> Step<T> {
        Err(Stop::Fail(self.err(msg)))
    }

    fn spend(&mut self, n: usize) -> Step<()> {
        match self.budget.checked_sub(n as u64) {
            Some(b) => {
                self.budget = b;
                Ok(())
            }
            None => self.fail("exceeds the work budget for its size"),
        }
    }

    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Stop::NeedMore)?;
        let s = self.data.get(self.pos..end).ok_or(Stop::NeedMore)?;
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Step<u64> {
        let b = self.take(n)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    /// A length prefix of `n` bytes, bounded by `MAX_STR`.
    fn len_prefix(&mut self, n: usize) -> Step<usize> {
        let len = self.le(n)?;
        if len > MAX_STR as u64 {
            return self.fail(format!(
                "a {len}-byte string exceeds the {MAX_STR}-byte limit"
            ));
        }
        Ok(len as usize)
    }

    /// A newline-terminated line (text opcodes), without the newline.
    fn line(&mut self) -> Step<&'a str> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        let limit = rest.len().min(MAX_STR);
        let Some(nl) = rest[..limit].iter().position(|&b| b == b'\n') else {
            if rest.len() > MAX_STR {
                return self.fail("text argument longer than the string limit");
            }
            return Err(Stop::NeedMore);
        };
        let s = self.take(nl + 1)?;
        std::str::from_utf8(&s[..nl]).or_else(|_| self.fail("text argument is not UTF-8"))
    }

    fn push(&mut self, v: Value) -> Step<()> {
        if self.stack.len() >= MAX_STACK {
            return self.fail(format!("stack deeper than {MAX_STACK}"));
        }
        self.spend(1)?;
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Step<Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.fail("stack underflow"),
        }
    }

    fn top(&mut self) -> Step<&mut Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        // Non-empty: checked above.
        let i = self.stack.len() - 1;
        Ok(&mut self.stack[i])
    }

    /// Everything above the latest mark, and the mark removed.
    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let Some(m) = self.marks.pop() else {
            return self.fail("no mark on the stack");
        };
        Ok(self.stack.split_off(m.min(self.stack.len())))
    }

    fn items(&self, v: Vec<Value>) -> Step<Items> {
        Items::new(v).or_else(|m| self.fail(m))
    }
}

// The opcodes, by their byte.
mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// The name of an opcode this reader refuses, if `b` is one.
fn refused_opcode(b: u8) -> Option<&'static str> {
    Some(match b {
        op::INST => "INST",
        op::OBJ => "OBJ",
        op::NEWOBJ => "NEWOBJ",
        op::NEWOBJ_EX => "NEWOBJ_EX",
        op::EXT1 | op::EXT2 | op::EXT4 => "EXT (extension registry)",
        op::EMPTY_SET | op::ADDITEMS | op::FROZENSET => "set",
        op::BYTEARRAY8 | op::NEXT_BUFFER | op::READONLY_BUFFER => "out-of-band buffer",
        _ => return None,
    })
}

impl Machine<'_> {
    fn run(&mut self) -> Step<Value> {
        loop {
            let code = self.u8()?;
            if code == op::STOP {
                let v = self.pop()?;
                return Ok(v);
            }
            if let Some(name) = refused_opcode(code) {
                self.pos -= 1;
                return Err(Stop::Fail(Error::PickleRefused {
                    file: self.file.to_owned(),
                    what: format!("opcode {name} (0x{code:02x}) at byte {}", self.pos),
                }));
            }
            if !self.scalar(code)? && !self.structural(code)? && !self.memo_op(code)? {
                self.pos -= 1;
                return self.fail(format!("unknown opcode 0x{code:02x}"));
            }
        }
    }

    /// Opcodes that push a scalar. False if `code` is not one.
    fn scalar(&mut self, code: u8) -> Step<bool> {
        let v = match code {
            op::PROTO => {
                let p = self.u8()?;
                if p > 5 {
                    return self.fail(format!("unknown protocol {p}"));
                }
                return Ok(true);
            }
            op::FRAME => {
                self.take(8)?;
                return Ok(true);
            }
            op::NONE => Value::None,
            op::NEWTRUE => Value::Bool(true),
            op::NEWFALSE => Value::Bool(false),
            op::BININT => Value::Int(i128::from(self.le(4)? as u32 as i32)),
            op::BININT1 => Value::Int(i128::from(self.u8()?)),
            op::BININT2 => Value::Int(i128::from(self.le(2)?)),
            op::LONG1 => {
                let n = self.u8()? as usize;
                self.long(n)?
            }
            op::LONG4 => {
                let n = self.len_prefix(4)?;
                self.long(n)?
            }
            op::INT => self.text_int()?,
            op::LONG => self.text_long()?,
            op::FLOAT => {
                let l = self.line()?;
                Value::Float(l.trim().parse().or_else(|_| self.fail("bad FLOAT"))?)
            }
            op::BINFLOAT => Value::Float(f64::from_bits(u64::from_be_bytes(
                self.take(8)?.try_into().unwrap_or([0; 8]),
            ))),
            op::BINUNICODE | op::SHORT_BINUNICODE | op::BINUNICODE8 => {
                let n = match code {
                    op::SHORT_BINUNICODE => 1,
                    op::BINUNICODE => 4,
                    _ => 8,
                };
                let len = self.len_prefix(n)?;
                let b = self.take(len)?;
                let s = std::str::from_utf8(b).or_else(|_| self.fail("string is not UTF-8"))?;
                self.spend(len / 16)?;
                Value::Str(s.into())
            }
            op::BINSTRING
            | op::SHORT_BINSTRING
            | op::BINBYTES
            | op::SHORT_BINBYTES
            | op::BINBYTES8 => {
                let n = match code {
                    op::SHORT_BINSTRING | op::SHORT_BINBYTES => 1,
                    op::BINBYTES8 => 8,
                    _ => 4,
                };
                let len = self.len_prefix(n)?;
                let b = self.take(len)?;
                self.spend(len / 16)?;
                match std::str::from_utf8(b) {
                    Ok(s) if matches!(code, op::BINSTRING | op::SHORT_BINSTRING) => {
                        Value::Str(s.into())
                    }
                    _ => Value::Bytes(b.into()),
                }
            }
            op::STRING | op::UNICODE => {
                let l = self.line()?;
                let s = l.trim_matches(|c| c == '\'' || c == '"');
                Value::Str(s.into())
            }
            _ => return Ok(false),
        };
        self.push(v)?;
        Ok(true)
    }

    /// A little-endian two's-complement integer of `n` bytes (at most 16).
    fn long(&mut self, n: usize) -> Step<Value> {
        if n > 16 {
            return self.fail(format!("a {n}-byte integer is too large"));
        }
        let b = self.take(n)?;
        let mut v: i128 = 0;
        for (i, &x) in b.iter().enumerate() {
            v |= i128::from(x) << (8 * i);
        }
        if n > 0 && n < 16 && b[n - 1] & 0x80 != 0 {
            v -= 1i128 << (8 * n);
        }
        Ok(Value::Int(v))
    }

    fn text_int(&mut self) -> Step<Value> {
        let l = self.line()?;
        Ok(match l {
            "00" => Value::Bool(false),
            "01" => Value::Bool(true),
            _ => Value::Int(l.parse().or_else(|_| self.fail("bad INT"))?),
        })
    }

    fn text_long(&mut self) -> Step<Value> {
        let l = self.line()?;
        let l = l.strip_suffix('L').unwrap_or(l);
        Ok(Value::Int(l.parse().or_else(|_| self.fail("bad LONG"))?))
    }
}

impl Machine<'_> {
    /// Stack, container and object opcodes. False if `code` is not one.
    fn structural(&mut self, code: u8) -> Step<bool> {
        Ok(self.stack_op(code)? || self.container_op(code)? || self.object_op(code)?)
    }

    /// Mark, pop and dup opcodes. False if `code` is not one.
    fn stack_op(&mut self, code: u8) -> Step<bool> {
        match code {
            op::MARK => {
                if self.marks.len() >= MAX_STACK {
                    return self.fail("too many marks");
                }
                self.marks.push(self.stack.len());
            }
            op::POP => {
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let v = self.top()?.clone();
                self.push(v)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Opcodes that build tuples, lists and dicts or add to them. False if `code` is not one.
    fn container_op(&mut self, code: u8) -> Step<bool> {
        match code {
            op::EMPTY_TUPLE => self.push(Value::Tuple(self.items(Vec::new())?))?,
            op::EMPTY_LIST => self.push(Value::List(self.items(Vec::new())?))?,
            op::EMPTY_DICT => self.push(Value::Dict(self.items(Vec::new())?))?,
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(code - op::TUPLE1 + 1);
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.pop()?);
                }
                v.reverse();
                self.push(Value::Tuple(self.items(v)?))?;
            }
            op::TUPLE | op::LIST | op::DICT => {
                let v = self.pop_mark()?;
                let value = match code {
                    op::TUPLE => Value::Tuple(self.items(v)?),
                    op::LIST => Value::List(self.items(v)?),
                    _ if v.len() % 2 == 0 => Value::Dict(self.items(v)?),
                    _ => return self.fail("DICT with an odd number of items"),
                };
                self.push(value)?;
            }
            op::APPEND => {
                let v = self.pop()?;
                self.extend(vec![v], false)?;
            }
            op::APPENDS => {
                let v = self.pop_mark()?;
                self.extend(v, false)?;
            }
            op::SETITEM => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.extend(vec![k, v], true)?;
            }
            op::SETITEMS => {
                let v = self.pop_mark()?;
                if v.len() % 2 != 0 {
                    return self.fail("SETITEMS with an odd number of items");
                }
                self.extend(v, true)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Global, reduce, build and persistent-id opcodes. False if `code` is not one.
    fn object_op(&mut self, code: u8) -> Step<bool> {
        match code {
            op::GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                let g = self.global(module, name)?;
                self.push(Value::Global(g))?;
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(m), Value::Str(n)) = (&module, &name) else {
                    return self.fail("STACK_GLOBAL needs two strings");
                };
                let g = self.global(m, n)?;
                self.push(Value::Global(g))?;
            }
            op::REDUCE => self.reduce()?,
            op::BUILD => self.build()?,
            op::BINPERSID => {
                let pid = self.pop()?;
                self.push(Value::PersId(Box::new(pid)))?;
            }
            op::PERSID => {
                let l = self.line()?;
                self.push(Value::PersId(Box::new(Value::Str(l.into()))))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// An allowed global, or the refusal naming it.
    fn global(&self, module: &str, name: &str) -> Step<Global> {
        Global::lookup(module, name).ok_or_else(|| {
            Stop::Fail(Error::PickleGlobal {
                file: self.file.to_owned(),
                name: format!("{module}.{name}"),
            })
        })
    }

    /// Append to the list (`dict`: false) or dict (`dict`: true) on top of the stack. A list or dict
    /// shared with the memo is copied first (spending budget for its length).
    fn extend(&mut self, new: Vec<Value>, dict: bool) -> Step<()> {
        let mut target = self.pop()?;
        let items = match (&mut target, dict) {
            (Value::List(i), false) => i,
            (Value::Dict(i) | Value::OrderedDict(i), true) => i,
            (t, _) => {
                let what = if dict { "set an item on" } else { "append to" };
                return self.fail(format!("cannot {what} a {}", t.kind()));
            }
        };
        if Rc::strong_count(&items.items) > 1 {
            self.spend(items.items.len())?;
        }
        let depth = 1 + new.iter().map(Value::depth).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        items.depth = items.depth.max(depth);
        Rc::make_mut(&mut items.items).extend(new);
        self.stack.push(target);
        Ok(())
    }

    /// `REDUCE`: an allowed global applied to an argument tuple. Nothing is called: the result records
    /// the global and its arguments (an `OrderedDict` becomes a dict value).
    fn reduce(&mut self) -> Step<()> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let Value::Tuple(args) = args else {
            return self.fail(format!(
                "REDUCE arguments are a {}, not a tuple",
                args.kind()
            ));
        };
        let v = match callable {
            Value::Global(Global::OrderedDict) => self.ordered_dict(&args)?,
            Value::Global(g @ (Global::RebuildTensorV2 | Global::RebuildParameter)) => {
                let depth = args.depth;
                if depth + 1 > MAX_DEPTH {
                    return self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
                }
                Value::Reduced(g, args)
            }
            Value::Global(Global::Storage(d)) => {
                return self.fail(format!("calling the {} storage class", d.as_str()))
            }
            other => return self.fail(format!("REDUCE on a {}", other.kind())),
        };
        self.push(v)
    }

    /// `OrderedDict()` or `OrderedDict([(k, v), ...])`.
    fn ordered_dict(&mut self, args: &Items) -> Step<Value> {
        let mut flat = Vec::new();
        match args.items.as_slice() {
            [] => {}
            [Value::List(pairs) | Value::Tuple(pairs)] => {
                self.spend(2 * pairs.items.len())?;
                for p in pairs.items.iter() {
                    match p {
                        Value::Tuple(kv) if kv.items.len() == 2 => {
                            flat.extend(kv.items.iter().cloned())
                        }
                        _ => return self.fail("OrderedDict items are not (key, value) pairs"),
                    }
                }
            }
            _ => return self.fail("OrderedDict takes no arguments or one list of pairs"),
        }
        Ok(Value::OrderedDict(self.items(flat)?))
    }

    /// `BUILD`: state on a dict (an `OrderedDict`'s `_metadata`) or a rebuilt tensor is ignored; on
    /// anything else it is refused.
    fn build(&mut self) -> Step<()> {
        let state = self.pop()?;
        match self.top()? {
            Value::Dict(_) | Value::OrderedDict(_) | Value::Reduced(..) => Ok(()),
            other => {
                let kind = other.kind();
                self.fail(format!("BUILD (set state {}) on a {kind}", state.kind()))
            }
        }
    }

    /// Memo opcodes. False if `code` is not one.
    fn memo_op(&mut self, code: u8) -> Step<bool> {
        // (how the index is written, whether the opcode stores into the memo or loads from it)
        let (arg, store) = match code {
            op::PUT => (MemoIndex::Line("bad PUT index"), true),
            op::BINPUT => (MemoIndex::Byte, true),
            op::LONG_BINPUT => (MemoIndex::U32, true),
            op::GET => (MemoIndex::Line("bad GET index"), false),
            op::BINGET => (MemoIndex::Byte, false),
            op::LONG_BINGET => (MemoIndex::U32, false),
            op::MEMOIZE => {
                self.put(self.memo.len() as u64)?;
                return Ok(true);
            }
            _ => return Ok(false),
        };
        let i = match arg {
            MemoIndex::Line(bad) => {
                let l = self.line()?;
                l.parse().or_else(|_| self.fail(bad))?
            }
            MemoIndex::Byte => u64::from(self.u8()?),
            MemoIndex::U32 => self.le(4)?,
        };
        if store {
            self.put(i)?;
        } else {
            self.get(i)?;
        }
        Ok(true)
    }

    fn put(&mut self, i: u64) -> Step<()> {
        let v = self.top()?.clone();
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&i) {
            return self.fail(format!("more than {MAX_MEMO} memo entries"));
        }
        self.spend(1)?;
        self.memo.insert(i, v);
        Ok(())
    }

    fn get(&mut self, i: u64) -> Step<()> {
        match self.memo.get(&i) {
            Some(v) => {
                let v = v.clone();
                self.push(v)
            }
            None => self.fail(format!("memo entry {i} was never stored")),
        }
    }
}

/// How a memo opcode writes its index: a decimal text line (with the error for a bad one), one byte,
/// or four little-endian bytes.
enum MemoIndex {
    Line(&'static str),
    Byte,
    U32,
}
