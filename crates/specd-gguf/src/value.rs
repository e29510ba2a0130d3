//! Metadata values.

/// GGUF metadata value type ids.
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
    /// From the GGUF type id (`None` for ids the format does not define).
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
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
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in a file: its fixed size, or the length
    /// (8) of a string, or the element type and count (12) of an array. A count of items can be
    /// checked against the bytes left before anything is sized by it.
    pub fn min_encoded_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type and elements (all of that type).
    Array(ValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            GgufValue::U8(_) => ValueType::U8,
            GgufValue::I8(_) => ValueType::I8,
            GgufValue::U16(_) => ValueType::U16,
            GgufValue::I16(_) => ValueType::I16,
            GgufValue::U32(_) => ValueType::U32,
            GgufValue::I32(_) => ValueType::I32,
            GgufValue::F32(_) => ValueType::F32,
            GgufValue::Bool(_) => ValueType::Bool,
            GgufValue::String(_) => ValueType::String,
            GgufValue::Array(..) => ValueType::Array,
            GgufValue::U64(_) => ValueType::U64,
            GgufValue::I64(_) => ValueType::I64,
            GgufValue::F64(_) => ValueType::F64,
        }
    }
    /// Short type description for error messages.
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::Array(t, v) => format!("array[{t:?}; {}]", v.len()),
            v => format!("{:?}", v.value_type()),
        }
    }
    /// As a signed integer if it is any integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }
    /// As f64 if it is a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }
}
