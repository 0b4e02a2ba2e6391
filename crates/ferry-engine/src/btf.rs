//! Just enough of the BPF Type Format to find, in the running kernel's
//! /sys/kernel/btf/vmlinux, a function's type id and where a structure
//! member lies (also inside anonymous unions and structures). Written
//! here because the BTF parser ferry already links (aya-obj) keeps
//! member offsets private; the format is a header, a type section and a
//! string section (Documentation/bpf/btf.rst).

use std::collections::HashMap;

const MAGIC: u16 = 0xeb9f;
pub const KIND_STRUCT: u8 = 4;
pub const KIND_UNION: u8 = 5;
pub const KIND_TYPEDEF: u8 = 8;
pub const KIND_VOLATILE: u8 = 9;
pub const KIND_CONST: u8 = 10;
pub const KIND_RESTRICT: u8 = 11;
pub const KIND_FUNC: u8 = 12;
pub const KIND_TYPE_TAG: u8 = 18;

struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
}

struct Type {
    name_off: u32,
    kind: u8,
    /// The referenced type (typedef, const...); unused for others.
    type_id: u32,
    members: Vec<Member>,
}

pub struct Btf {
    /// Index = type id; 0 is void.
    types: Vec<Type>,
    strings: Vec<u8>,
    by_name: HashMap<(u8, String), u32>,
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| format!("BTF ends at byte {at}"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("BTF ends at byte {at}"))
}

/// The type section: type 0 is void, the others in order.
fn parse_types(ty: &[u8]) -> Result<Vec<Type>, String> {
    let mut types = vec![Type { name_off: 0, kind: 0, type_id: 0, members: Vec::new() }];
    let mut at = 0;
    while at < ty.len() {
        let name_off = u32_at(ty, at)?;
        let info = u32_at(ty, at + 4)?;
        let size_or_type = u32_at(ty, at + 8)?;
        at += 12;
        let kind = ((info >> 24) & 0x1f) as u8;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let mut members = Vec::new();
        let extra = match kind {
            1 | 14 | 17 => 4, // int, var, decl tag
            3 => 12,          // array
            KIND_STRUCT | KIND_UNION => {
                for i in 0..vlen {
                    let m = at + i * 12;
                    let raw = u32_at(ty, m + 8)?;
                    // With kind_flag the high 8 bits are a bitfield size.
                    let bit_offset = if kind_flag { raw & 0x00ff_ffff } else { raw };
                    members.push(Member {
                        name_off: u32_at(ty, m)?,
                        type_id: u32_at(ty, m + 4)?,
                        bit_offset,
                    });
                }
                vlen * 12
            }
            6 | 13 => vlen * 8,        // enum, func proto
            15 | 19 => vlen * 12,      // datasec, enum64
            2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, modifiers, func, float, type tag
            k => return Err(format!("BTF type {} has unknown kind {k}", types.len())),
        };
        at += extra;
        types.push(Type { name_off, kind, type_id: size_or_type, members });
    }
    Ok(types)
}

impl Btf {
    /// Parses little-endian BTF (x86_64's).
    pub fn parse(b: &[u8]) -> Result<Btf, String> {
        if u16_at(b, 0)? != MAGIC {
            return Err("not BTF (bad magic)".into());
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or("BTF section offset overflows")?;
            let end = start.checked_add(len).ok_or("BTF section length overflows")?;
            b.get(start..end)
                .ok_or_else(|| format!("BTF section {start}..{end} beyond its {} bytes", b.len()))
        };
        let ty = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();
        let types = parse_types(ty)?;
        let mut btf = Btf { types, strings, by_name: HashMap::new() };
        let mut by_name = HashMap::new();
        for (id, t) in btf.types.iter().enumerate().skip(1) {
            if t.name_off != 0 {
                by_name.entry((t.kind, btf.name(t.name_off).to_string())).or_insert(id as u32);
            }
        }
        btf.by_name = by_name;
        Ok(btf)
    }

    fn name(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// The id of the type of `kind` named `name`.
    pub fn find(&self, kind: u8, name: &str) -> Option<u32> {
        self.by_name.get(&(kind, name.to_string())).copied()
    }

    /// `id` with typedefs and qualifiers stripped.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.type_id
                }
                _ => break,
            }
        }
        id
    }

    /// Byte offset of member `name` in the structure or union `id`,
    /// looking into anonymous members; None if it is not there or not
    /// byte-aligned.
    pub fn member_offset(&self, id: u32, name: &str) -> Option<u32> {
        self.member_bits(id, name, 0).filter(|b| b % 8 == 0).map(|b| b / 8)
    }

    /// Bit offset of member `name` (a bitfield too) in `id`.
    pub fn member_bit_offset(&self, id: u32, name: &str) -> Option<u32> {
        self.member_bits(id, name, 0)
    }

    fn member_bits(&self, id: u32, name: &str, depth: u32) -> Option<u32> {
        let t = self.types.get(self.resolve(id) as usize)?;
        if depth > 8 || !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        for m in &t.members {
            if m.name_off != 0 && self.name(m.name_off) == name {
                return Some(m.bit_offset);
            }
        }
        t.members
            .iter()
            .filter(|m| m.name_off == 0)
            .find_map(|m| Some(m.bit_offset + self.member_bits(m.type_id, name, depth + 1)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BTF with: 1 int, 2 struct inner {a@0, b@64}, 3 union {inner(anon)@0},
    /// 4 struct outer {x@0, (anon union)@64, flags@192}, 5 func "f".
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0b\0outer\0x\0flags\0f\0".to_vec();
        let off = |s: &str| {
            let needle = format!("\0{s}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .map(|p| p as u32 + 1)
                .unwrap_or(0)
        };
        let mut t: Vec<u8> = Vec::new();
        let mut put =
            |words: &[u32]| words.iter().for_each(|w| t.extend_from_slice(&w.to_le_bytes()));
        put(&[off("int"), 1 << 24, 8, 64]);
        put(&[off("inner"), (4 << 24) | 2, 16, off("a"), 1, 0, off("b"), 1, 64]);
        put(&[0, (5 << 24) | 1, 16, 0, 2, 0]);
        put(&[off("outer"), (4 << 24) | 3, 32, off("x"), 1, 0, 0, 3, 64, off("flags"), 1, 192]);
        put(&[off("f"), 12 << 24, 0]);
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for w in [24u32, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn members_are_found_through_anonymous_unions_and_structs() {
        let btf = Btf::parse(&sample()).expect("parse");
        let outer = btf.find(KIND_STRUCT, "outer").expect("outer");
        assert_eq!(btf.member_offset(outer, "x"), Some(0));
        assert_eq!(btf.member_offset(outer, "a"), Some(8));
        assert_eq!(btf.member_offset(outer, "b"), Some(16));
        assert_eq!(btf.member_offset(outer, "flags"), Some(24));
        assert_eq!(btf.member_offset(outer, "nope"), None);
        assert_eq!(btf.find(KIND_FUNC, "f"), Some(5));
        assert_eq!(btf.find(KIND_FUNC, "g"), None);
    }

    #[test]
    fn truncated_or_foreign_data_is_an_error() {
        let b = sample();
        assert!(Btf::parse(&b[..b.len() - 20]).is_err());
        assert!(Btf::parse(&b[..30]).is_err());
        assert!(Btf::parse(b"not btf at all, not even close").is_err());
        let mut bad_kind = b.clone();
        bad_kind[24 + 7] = 0x1f; // first type's kind: 31
        assert!(Btf::parse(&bad_kind).is_err());
    }

    #[test]
    fn the_running_kernels_btf_has_what_the_vma_iterator_needs() {
        let Ok(bytes) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = Btf::parse(&bytes).expect("parse the kernel's BTF");
        assert!(btf.find(KIND_FUNC, "bpf_iter_task_vma").is_some());
        let vma = btf.find(KIND_STRUCT, "vm_area_struct").expect("vm_area_struct");
        assert_eq!(btf.member_offset(vma, "vm_start"), Some(0));
        assert_eq!(btf.member_offset(vma, "vm_end"), Some(8));
        assert!(btf.member_offset(vma, "vm_flags").is_some());
    }
}
