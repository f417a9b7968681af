#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets into fuzz/corpus/<target>/.

Valid inputs of each format (so the fuzzer starts from the interesting paths)
and the crafted inputs of issue 9 as regression seeds (each was a crash or an
unnamed error before).  Deterministic; rerun after changing it.

    /usr/bin/python3 fuzz/make_seeds.py
"""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def st_seeds():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    out("safetensors", "f32_2x2", safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                               "__metadata__": {"format": "pt"}}, f32))
    out("safetensors", "bf16_scalar_and_f16",
        safetensors({"a": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]},
                     "b": {"dtype": "F16", "shape": [3], "data_offsets": [2, 8]},
                     "c": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}},
                    b"\x80\x3f" + b"\x00\x3c\x00\xc0\x00\x7c" + struct.pack("<d", 1.5)))
    out("safetensors", "i32_and_empty",
        safetensors({"i": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                     "e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [8, 8]}}, struct.pack("<2i", 7, -1)))
    # Regressions (issue 9).
    out("safetensors", "regress_huge_shape",
        safetensors({"t": {"dtype": "F32", "shape": [1 << 62, 4], "data_offsets": [0, 0]}}))
    h = b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,1e400]}}'
    out("safetensors", "regress_1e400", struct.pack("<Q", len(h)) + h + b"\0" * 4)
    # Found by fuzz_safetensors: a float where an integer belongs (UB in the conversion).
    out("safetensors", "regress_float_shape",
        safetensors({"t": {"dtype": "F32", "shape": [7.46117e+19], "data_offsets": [0, 4]}}, b"\0" * 4))
    out("safetensors", "regress_overlap",
        safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))


def config_seeds():
    q06 = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
           "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
           "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
           "vocab_size": 151936}
    out("config", "qwen3_0.6b.json", json.dumps(q06, indent=2))
    routed = dict(q06, model_type="qwen3_attnres", architectures=["Qwen3AttnResForCausalLM"],
                  attnres_mode="delta_block", attnres_num_blocks=4, attnres_gate_type="learnable_alpha",
                  attnres_use_null_source=True)
    out("config", "reference_delta_block.json", json.dumps(routed))
    out("config", "tiny_all_keys.json", json.dumps({
        "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "intermediate_size": 12, "vocab_size": 11, "attnres_mode": "block",
        "attnres_block_delta": "true", "attnres_query_init": "normal"}))
    # Regressions (issue 9).
    out("config", "regress_vocab_2e62.json", json.dumps(dict(q06, vocab_size=1 << 62)))
    out("config", "regress_deep.json", '{"hidden_size": ' + "[" * 100000 + "]" * 100000 + "}")
    # Found by fuzz_config: a float where an integer belongs.
    out("config", "regress_float_int.json", json.dumps(dict(q06, max_position_embeddings=1.11111e+95)))
    out("config", "regress_1e400.json", '{"hidden_size": 8, "rope_theta": 1e400}')


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_seeds():
    bu = bytes_to_unicode()
    vocab = {bu[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("o", " "), (" ", "w")]:
        vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    tok = {"version": "1.0", "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True,
                                              "lstrip": False, "rstrip": False, "single_word": False,
                                              "normalized": False}],
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                                      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": False}}
    out("tokenizer", "small_bpe.json", json.dumps(tok))
    bad = json.loads(json.dumps(tok))
    bad["model"]["vocab"]["zz"] = -1
    out("tokenizer", "regress_id_minus_1.json", json.dumps(bad))
    bad["model"]["vocab"]["zz"] = 1 << 40
    out("tokenizer", "regress_id_2e40.json", json.dumps(bad))
    bad = json.loads(json.dumps(tok))
    bad["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"
    out("tokenizer", "regress_bad_regex.json", json.dumps(bad))


def token_file_seeds():
    def tf(version, ids, count=None):
        h = [20240520, version, len(ids) if count is None else count] + [0] * 253
        fmt = "<%dH" % len(ids) if version == 1 else "<%dI" % len(ids)
        return struct.pack("<256i", *h) + struct.pack(fmt, *ids)
    out("token_file", "v1", tf(1, [1, 2, 3, 65535]))
    out("token_file", "v2", tf(2, [1, 2, 70000, 5]))
    out("token_file", "regress_count_too_big", tf(2, [1, 2], count=(1 << 31) - 1))


def corpus_seeds():
    lines = '{"text": "Hello world.\\n\\nSecond paragraph."}\n\n{"text": "more", "id": 3}\r\n{"text": ""}\n'
    out("corpus", "plain.jsonl", lines)
    out("corpus", "gzip.jsonl.gz", gzip.compress(lines.encode(), mtime=0))
    out("corpus", "text_paragraphs", "line one\nline two\n\n\nnext doc\n" * 20)
    out("corpus", "regress_long_line.gz", gzip.compress(b'{"text": "' + b"0" * (1 << 18), mtime=0))


if __name__ == "__main__":
    st_seeds()
    config_seeds()
    tokenizer_seeds()
    token_file_seeds()
    corpus_seeds()
