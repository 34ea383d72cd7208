"""Safe loops that were refused or stopped (issue 28 §3, falsely stopped), each
compared with its serial run on a real cluster, and the neighbouring unsafe
shapes refused with a message that says why.

- an own column or key: ``for c in df.columns: df[c] = df[c].fillna(...)``,
  a literal list of distinct names, ``dict.fromkeys(cols)``; not ``for c in
  cols`` (its items may repeat);
- a method of the iteration's own slice: ``img[b, c] = img[b, c] -
  img[b, c].mean()`` in nested loops (numpy and torch reductions that return a
  new object); not ``.sort()``, ``.fill()``, views, ``out=``;
- several read-modify-write statements on one own row or element;
- a generator's attribute names taken for the loop's variables: ``for index,
  row in df.iterrows()`` (``iterrows`` reads ``self.index``).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from test_parallel import assert_serial_equivalent

from gpucell.core.analysis import analyse
from gpucell.errors import NotParallelizable


def refused(src: str) -> dict[tuple[str, str], str]:
    """The refusals of a cell (analysis only): ``{(name, kind): text}``."""
    p = analyse(textwrap.dedent(src), raise_errors=False)
    assert p.diagnostics, "expected a refusal"
    return {(d.name, d.kind): d.text for d in p.diagnostics}


def accepted(src: str):
    p = analyse(textwrap.dedent(src), raise_errors=False)
    assert not p.diagnostics, [d.text for d in p.diagnostics]
    return p


def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "a": [1.0, np.nan, 3.0, 4.0, np.nan, 6.0],
            "b": [np.nan, 2.0, 2.0, np.nan, 5.0, 1.0],
            "c": [1, 2, 3, 4, 5, 6],
            "name": list("uvwxyz"),
        }
    )


# -- own columns and keys ---------------------------------------------------------

OWN_KEYS = {
    "frame's columns, fillna with the column's mean": (
        "for c in df.select_dtypes('number').columns:\n"
        "    df[c] = df[c].fillna(df[c].mean())\n",
        lambda: {"df": frame()},
    ),
    "literal list of names, standardised": (
        "for c in ['a', 'b', 'c']:\n"
        "    mu = df[c].mean()\n"
        "    df[c] = (df[c] - mu) / df[c].std()\n",
        lambda: {"df": frame()},
    ),
    "a slice of the columns": (
        "for col in df.columns[:2]:\n    df[col] = df[col].fillna(0).cumsum()\n",
        lambda: {"df": frame()},
    ),
    "a slice of the columns as a list, less one": (
        "for c in df.columns.drop('name').tolist()[1:]:\n"
        "    df[c] = df[c].fillna(-1)\n",
        lambda: {"df": frame()},
    ),
    "a tuple literal of keys": (
        "for k in ('x', 'y'):\n    d[k] = d[k] * 2 + str(len(d[k]))\n",
        lambda: {"d": {"x": "ab", "y": "cde", "z": "f"}},
    ),
    "dict.fromkeys of a list that repeats a name": (
        "for c in dict.fromkeys(cols):\n    df[c] = df[c].clip(lower=2)\n",
        lambda: {"df": frame(), "cols": ["a", "c", "a"]},
    ),
    "a dict's keys": (
        "for k in cfg.keys():\n    cfg[k] = str(cfg[k]).upper()\n",
        lambda: {"cfg": {"lr": 0.1, "opt": "adam", "n": 3}},
    ),
    "sorted set of labels": (
        "for k in sorted(set(labels)):\n    counts[k] = counts[k] + labels.count(k)\n",
        lambda: {"labels": list("abcabca"), "counts": {"a": 10, "b": 20, "c": 0}},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(OWN_KEYS))
def test_own_columns_and_keys_match_the_serial_run(ip, cluster, case) -> None:
    cell, ns = OWN_KEYS[case]
    accepted(cell)
    assert_serial_equivalent(ip, cell, ns())  # (frames: values, dtypes, axes)


@pytest.mark.parametrize(
    "src",
    [
        "for c in cols:\n    df[c] = df[c].fillna(df[c].mean())\n",
        "for c in df.columns[[0, 0]]:\n    df[c] = df[c] + 1\n",
        "for c in df.columns.repeat(2):\n    df[c] = df[c] + 1\n",
        # a selection may repeat a column (`df[['a', 'a']]`)
        "for c in df[sel].columns:\n    df[c] = df[c] + 1\n",
    ],
)
def test_keys_that_may_repeat_are_refused(src: str) -> None:
    kinds = {kind for name, kind in refused(src) if name == "df"}
    assert kinds & {"sink-read", "iterable-mutated"}, kinds


# `D[k] = D[k] op e` over keys that may repeat is a keyed reduction (each
# key's contributions folded, stored once): exact where a store keeps what it
# is given (a dict, a list, a DataFrame's whole column), refused before the
# loop runs where a store casts to a dtype (an array, a tensor, a Series) and
# the keys are not the loop's own positions
REPEATED_KEYS = {
    "frame columns that repeat": (
        "for c in ['a', 'b', 'a']:\n    df[c] = df[c] * 2\n",
        lambda: {"df": pd.DataFrame({"a": [1, 2], "b": [3, 4]})},
    ),
    "frame columns, an int column made float twice": (
        "for c in sorted(cols):\n    df[c] = df[c] + 0.5\n",
        lambda: {"df": pd.DataFrame({"a": [1, 2], "b": [3, 4]}), "cols": list("aab")},
    ),
    "another frame's columns": (
        "for c in other.columns:\n    df[c] = df[c] + 1\n",
        lambda: {
            "df": pd.DataFrame({"a": [1, 2], "b": [3, 4]}),
            "other": pd.DataFrame({"b": [0], "a": [0]}),
        },
    ),
    "dict keys that repeat": (
        "for k in [0, 'a', 0]:\n    s[k] = s[k] * 2\n",
        lambda: {"s": {0: 3, "a": 5}},
    ),
    "an int array keyed by the loop's own position": (
        "for i in range(3):\n    y[i] += 2 * i\n",
        lambda: {"y": np.array([1, 2, 3])},
    ),
    "a histogram: int counts into an int array, keys repeating": (
        "for w in words:\n    hist[index[w]] += 1\n",
        lambda: {
            "hist": np.zeros(3, dtype=np.int64),
            "words": list("abcabca"),
            "index": {"a": 0, "b": 1, "c": 2},
        },
    ),
    "a float array, float contributions, keys repeating": (
        "for i in [0, 2, 0]:\n    y[i] = y[i] + 0.25\n",
        lambda: {"y": np.array([1.0, 2.0, 3.0])},
    ),
    "a float tensor keyed by enumerate's count": (
        "for j, v in enumerate(vals):\n    t[j] = t[j] + v\n",
        lambda: {"t": torch.tensor([1.0, 2.0]), "vals": [0.25, 0.5]},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(REPEATED_KEYS))
def test_keys_that_may_repeat_fold_as_serially(ip, cluster, case) -> None:
    cell, ns = REPEATED_KEYS[case]
    accepted(cell)
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("cell", "ns", "kind"),
    [
        # serially y stays [1, 2, 3]: each 1.5 is cast back to 1 before the next
        (
            "for i in [0, 0, 1, 2, 2]:\n    y[i] = y[i] + 0.5\n",
            lambda: {"y": np.array([1, 2, 3])},
            "numpy.ndarray",
        ),
        (
            "for i in [0, 0, 1]:\n    y[i] += 0.5\n",
            lambda: {"y": np.array([1, 2, 3])},
            "numpy.ndarray",
        ),
        (
            "for i in [0, 0, 2]:\n    t[i] = t[i] + 0.5\n",
            lambda: {"t": torch.tensor([1, 2, 3])},
            "torch.Tensor",
        ),
        # a label and a position may name one element of a Series
        (
            "for k in [0, 'a']:\n    s[k] = s[k] * 2\n",
            lambda: {"s": pd.Series([1, 2], index=["a", "b"])},
            "pandas.Series",
        ),
    ],
)
def test_keys_that_may_repeat_into_a_casting_store_are_refused(
    ip, cluster, cell, ns, kind
) -> None:
    values = ns()
    before = {k: v.copy() if hasattr(v, "copy") else v for k, v in values.items()}
    ip.user_ns.update(values)
    with pytest.raises(NotParallelizable) as e:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    text = str(e.value)
    # a Series before the loop runs; an array or tensor at the merge, where a
    # key's folded value is of another kind than the dtype: nothing merged
    assert (
        "is combined across iterations" in text and kind in text
    ) or "of another kind" in text, text
    assert "parts.get(k, 0)" in text  # the rewrite it names
    for k, v in before.items():  # nothing of the loop merged
        now = ip.user_ns[k]
        assert type(now) is type(v) and str(now) == str(v)


def test_the_refusal_for_a_list_of_names_says_why_and_what_works() -> None:
    text = refused("for c in cols:\n    df[c] = df[c].fillna(df[c].mean())\n")[
        ("df", "sink-read")
    ]
    assert "only when no two items of `cols` are equal" in text
    assert "`df.columns`" in text and "`dict.fromkeys(cols)`" in text
    assert "`for c, v in df.items(): df[c] = f(v)`" in text
    # each form it names is accepted
    for header in (
        "for c in df.columns:",
        "for c in dict.fromkeys(cols):",
        "for c in ['a', 'b']:",
    ):
        accepted(header + "\n    df[c] = df[c].fillna(df[c].mean())\n")
    accepted("for c, v in df.items():\n    df[c] = v.fillna(v.mean())\n")


@pytest.mark.cluster
def test_a_frame_with_a_repeated_column_is_refused_before_the_loop(ip, cluster):
    df = pd.DataFrame([[1.0, 2.0, 3.0]], columns=["a", "a", "b"])
    ip.user_ns["df"] = df
    with pytest.raises(NotParallelizable, match="duplicate labels"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for c in df.columns:\n    df[c] = df[c] * 2\n"
        )
    assert ip.user_ns["df"] is df
    assert df.values.tolist() == [[1.0, 2.0, 3.0]]


# -- a method of the iteration's own slice -------------------------------------------

OWN_SLICES = {
    "per-channel centring of an image batch": (
        "for b in range(img.shape[0]):\n    for c in range(img.shape[1]):\n"
        "        img[b, c] = img[b, c] - img[b, c].mean()\n",
        lambda: {"img": np.arange(120.0).reshape(4, 3, 5, 2) ** 1.5},
    ),
    "standardised with mean and std, an int image (stored values cast)": (
        "for b in range(len(img)):\n    for c in range(3):\n"
        "        img[b, c] = (img[b, c] - img[b, c].mean()) * 10 // "
        "(img[b, c].std() + 1)\n",
        lambda: {"img": (np.arange(5 * 3 * 8) % 7).reshape(5, 3, 8)},
    ),
    "-= the slice's mean, numpy's function form": (
        "import numpy as np\n"
        "for b in range(B):\n    for c in range(C):\n"
        "        img[b, c] -= np.mean(img[b, c]) + img[b, c].max() * 0.1\n",
        lambda: {"img": np.linspace(0, 1, 6 * 2 * 4).reshape(6, 2, 4), "B": 6, "C": 2},
    ),
    "torch tensor, enumerate": (
        "for b, w in enumerate(weights):\n    for c in range(x.shape[1]):\n"
        "        x[b, c] = (x[b, c] - x[b, c].mean()) * w + x[b].sum() * 0.01\n",
        lambda: {
            "x": torch.arange(5 * 2 * 3, dtype=torch.float32).reshape(5, 2, 3),
            "weights": [0.5, 1.0, 1.5, 2.0, 2.5],
        },
    ),
    "a row normalised as it changes (reads its own writes)": (
        "for i in range(m.shape[0]):\n    for j in range(m.shape[1]):\n"
        "        m[i, j] = m[i, j] / m[i].sum()\n",
        lambda: {"m": np.arange(1.0, 25.0).reshape(6, 4)},
    ),
    "list rows, a list method that reads": (
        "for i in range(len(g)):\n    for j in range(len(g[i])):\n"
        "        g[i][j] = g[i][j] * 2 + g[i].count(0)\n",
        lambda: {"g": [[0, 1, 0], [2, 0, 3], [4, 5, 6], [0, 0, 0]]},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(OWN_SLICES))
def test_methods_of_the_own_slice_match_the_serial_run(ip, cluster, case) -> None:
    cell, ns = OWN_SLICES[case]
    plan = accepted(cell)
    assert [r.mode for r in plan.own_rows] == ["row"]
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.parametrize(
    "src",
    [
        # changes the slice in place, unseen by the write record
        "for b in range(B):\n    for c in range(C):\n"
        "        img[b, c] = img[b, c] - 1\n        img[b, c].sort()\n",
        "for b in range(B):\n    for c in range(C):\n"
        "        img[b, c] = img[b, c] - 1\n        img[b, c].fill(0)\n",
        "for b in range(B):\n    for c in range(C):\n"
        "        img[b, c] = img[b, c].clip(0, 1, out=img[b, c])\n",
        "for b in range(B):\n    for c in range(C):\n"
        "        img[b, c] = np.sqrt(img[b, c], out=img[b, c])\n",
        # a view of the row that the body then changes
        "for b in range(B):\n    for c in range(C):\n"
        "        v = img[b, c].ravel()\n        v[0] = 1\n"
        "        img[b, c] = img[b, c] * 2\n",
        # the method could change an object from outside the iteration
        "for i in range(n):\n    S[i][0] = obj\n    S[i][1] = S[i][0].mean()\n",
    ],
)
def test_methods_that_may_change_the_slice_are_refused(src: str) -> None:
    assert refused(src)


# -- several read-modify-write statements on one own row or element --------------

SEVERAL_WRITES = {
    "a list element, twice": (
        "for i in range(len(y)):\n    y[i] = y[i] * 2\n    y[i] = y[i] + 1\n",
        lambda: {"y": [3, 1, 4, 1, 5, 9, 2, 6]},
    ),
    "under a test that reads the first write": (
        "for i in range(len(y)):\n    y[i] = y[i] * 3\n    if y[i] > 10:\n"
        "        y[i] = y[i] - 10\n",
        lambda: {"y": [3.5, 1, 4, 1, 5, 9, 2, 6]},
    ),
    "augmented, three times": (
        "for i, w in enumerate(ws):\n    y[i] *= w\n    y[i] += 1\n    y[i] //= 3\n",
        lambda: {"y": [7, 8, 9, 10, 11], "ws": [1, 2, 3, 4, 5]},
    ),
    "a dict by position, two sinks interleaved": (
        "for i in range(n):\n    d[i] = d[i] * 2\n    z[i] = z[i] + d[i]\n"
        "    d[i] = d[i] - z[i]\n",
        lambda: {"n": 6, "d": {i: i + 1 for i in range(6)}, "z": [10] * 6},
    ),
    "one element of a numpy row, int (stored values cast)": (
        "for i in range(m.shape[0]):\n    m[i, 0] = m[i, 0] / 3\n"
        "    m[i, 0] = m[i, 0] * 2 + m[i, 1]\n",
        lambda: {"m": np.arange(20).reshape(10, 2)},
    ),
    "through functions, twice (the brief's y[i] = f(y[i]); y[i] = g(y[i]))": (
        "import math\nimport operator\n"
        "for i in range(len(y)):\n    y[i] = math.sqrt(y[i])\n"
        "    y[i] = operator.sub(y[i], 2)\n    y[i] = str(round(y[i], 3)).zfill(6)\n",
        lambda: {"y": [1, 4, 9, 16, 2]},
    ),
    "through a method, a list of numpy scalars": (
        "for i in range(len(y)):\n    y[i] = y[i] * 2.55\n    y[i] = y[i].round(1)\n",
        lambda: {"y": [np.float64(v) for v in (1.0, 2.5, 3.25)]},
    ),
    "in a nested loop, through a function": (
        "for b in range(len(y)):\n    for c in range(3):\n"
        "        y[b] = max(y[b], c) + len(str(y[b]))\n",
        lambda: {"y": [5, 0, 12, 100]},
    ),
    "the rewrite for a 1-D array: a local, written once": (
        "for i in range(len(y)):\n    v = y[i] / 3\n    v = v * 2 + 1\n    y[i] = v\n",
        lambda: {"y": np.arange(9)},
    ),
    "the rewrite for a frame's columns: a local, written once": (
        "for c in df.columns[:3]:\n    v = df[c].fillna(0)\n    v = v * 2\n"
        "    df[c] = v\n",
        lambda: {"df": frame()},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(SEVERAL_WRITES))
def test_several_writes_of_the_own_item_match_the_serial_run(ip, cluster, case):
    cell, ns = SEVERAL_WRITES[case]
    accepted(cell)
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
def test_several_writes_of_a_1d_array_element_are_refused_before_the_loop(
    ip, cluster
) -> None:
    # serially `y[i] = y[i] / 3` stores an int and the next line reads it back;
    # an engine's private element would keep the float
    y = np.arange(9)
    ip.user_ns["y"] = y
    cell = "for i in range(len(y)):\n    y[i] = y[i] / 3\n    y[i] = y[i] * 2 + 1\n"
    with pytest.raises(NotParallelizable, match="assigns whole and reads back"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["y"] is y and y.tolist() == list(range(9))


@pytest.mark.parametrize(
    ("src", "own", "where"),
    [
        (
            "for c in df.columns:\n    df[c] = df[c].fillna(0)\n"
            "    df[c] = df[c] * 2\n",
            "df[c]",
            "on lines 2 and 3",
        ),
        (
            "for k in ['a', 'b']:\n    d[k] = f(d[k])\n    d[k] = g(d[k])\n",
            "d[k]",
            "on lines 2 and 3",
        ),
        (
            "for k in ['a', 'b']:\n    for c in range(C):\n        d[k] = f(d[k])\n",
            "d[k]",
            "in a nested loop (line 3)",
        ),
    ],
)
def test_several_writes_that_stay_refused_say_to_write_once(src, own, where) -> None:
    texts = refused(src)
    assert set(texts) == {(own.split("[")[0], "sink-read")}  # nothing else
    (text,) = texts.values()
    assert f"writes it {where}" in text
    assert f"then `{own} = v`" in text
    # and the rewrite it names is accepted
    body = f"    v = {own}\n    v = f(v)\n    v = g(v)\n    {own} = v\n"
    header = src.splitlines()[0]
    accepted(f"{header}\n{body}")


# -- a library generator's attribute names are not the loop's variables -----------

# The kernel's generator check (kernel/preflight.py, _interleaved_generators)
# reads a generator with gpucell.core.globalreads.generator_reads: globals only
# (iterrows reads `self.index`, no global `index`), and only notebook code.
ITERROWS = {
    "for index, row in df.iterrows()": (
        "for index, row in df.iterrows():\n    out[index] = row['a'] * 2 + row['c']\n",
        lambda: {"df": frame(), "out": {}},
    ),
    "the documented own-row write, by label": (
        "for index, row in df.iterrows():\n    df.at[index, 'c'] = row['c'] * 10\n",
        lambda: {"df": frame()},
    ),
    "a local named like what iterrows reads (`values`)": (
        "for k, row in df.iterrows():\n    values = [row['a'], row['c']]\n"
        "    out[k] = values\n",
        lambda: {"df": frame(), "out": {}},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(ITERROWS))
def test_library_generators_are_not_read_for_attribute_names(ip, cluster, case):
    cell, ns = ITERROWS[case]
    accepted(cell)  # (the analysis accepts it; the kernel's check refuses)
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
def test_the_same_loop_with_another_variable_name_runs(ip, cluster) -> None:
    cell = "for idx, row in df.iterrows():\n    df.at[idx, 'c'] = row['c'] * 10\n"
    assert_serial_equivalent(ip, cell, {"df": frame()})


@pytest.mark.cluster
def test_a_notebook_generator_reading_what_the_loop_changes_stays_refused(
    ip, cluster
) -> None:
    ip.run_cell(
        "def counts():\n    for _ in range(3):\n        yield len(out)\n"
    ).raise_error()
    ip.user_ns["out"] = []
    with pytest.raises(NotParallelizable, match="reads `out`"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for n in counts():\n    out.append(n)\n"
        )
    assert ip.user_ns["out"] == []


# -- whole elements read back only of lists and dicts -----------------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("cell", "ns"),
    [
        # serially `df[i] = s` aligns `s` to the frame's index (NaN where it
        # has no label), so `sum(df[i])` is nan; an engine's private column
        # would be `s` itself (this merged [30.0, 30.0] without a word)
        (
            "for i in range(2):\n    df[i] = s\n    t[i] = sum(df[i])\n",
            lambda: {
                "df": pd.DataFrame({0: [1.0, 2.0, 3.0], 1: [4.0, 5.0, 6.0]}),
                "s": pd.Series([10.0, 20.0], index=[0, 5]),
                "t": [0, 0],
            },
        ),
        # a Series casts what it stores to its dtype
        (
            "for i in range(len(s)):\n    s[i] = s[i] / 4\n    s[i] = s[i] * 4\n",
            lambda: {"s": pd.Series([1, 2, 3, 4])},
        ),
    ],
)
def test_whole_elements_read_back_of_other_containers_fail_unmerged(
    ip, cluster, cell, ns
) -> None:
    before = ns()
    ip.user_ns.update(before)
    plan = accepted(cell)
    assert [r.mode for r in plan.own_rows] == ["value"]
    with pytest.raises(Exception, match="assigns whole and reads back"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    for k, v in before.items():
        assert ip.user_ns[k] is v  # nothing merged
    fresh = ns()
    for k, v in fresh.items():
        if isinstance(v, (pd.DataFrame, pd.Series)):
            assert v.equals(before[k])
        else:
            assert v == before[k]


# -- a negative position names the element of a positive one ----------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    "cell",
    [
        # serially y[-3] is doubled, then y[0], the same element, again: an
        # engine's iterations each read the value from before the loop (these
        # merged [2, 4, 6] against the serial [4, 8, 12] without a word)
        "for i in range(-3, 3):\n    y[i] = y[i] * 2\n",
        "for i in set(idx):\n    y[i] = y[i] * 2\n",
        "for i in range(k, 3):\n    y[i] = y[i] * 2\n    y[i] = y[i] + 1\n",
        # `y[True]` is `y[1]` of a list
        "for i in set(flags):\n    y[i] = y[i] * 2\n",
    ],
)
def test_an_own_item_under_a_negative_position_fails_unmerged(ip, cluster, cell):
    y = [1, 2, 3]
    ip.user_ns.update(y=y, idx=[0, -3], k=-3, flags=[True, 1.0 + 1])
    with pytest.raises(IndexError, match="may name the element of another"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["y"] is y and y == [1, 2, 3]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("cell", "ns"),
    [
        # a dict's negative keys are keys of their own
        (
            "for i in range(-3, 3):\n    d[i] = d[i] * 2\n",
            lambda: {"d": {i: i + 10 for i in range(-3, 3)}},
        ),
        # positions that cannot be negative: no check at all
        (
            "for i in range(n - 1, -1, -1):\n    y[i] = y[i] * 2 + n\n",
            lambda: {"y": [1, 2, 3, 4], "n": 4},
        ),
        (
            "for i in set(idx):\n    y[i] = y[i] * 2\n",
            lambda: {"y": [1, 2, 3], "idx": [2, 0]},
        ),
        # a dict's keys may be anything hashable
        (
            "for k in set(ks):\n    d[k] = d[k] * 2\n",
            lambda: {
                "ks": [(0, 1), 0, True, "a"],
                "d": {(0, 1): 1, 0: 2, "a": 3, 1: 4},
            },
        ),
    ],
)
def test_own_items_under_positions_that_do_not_alias_match_the_serial_run(
    ip, cluster, cell, ns
) -> None:
    assert_serial_equivalent(ip, cell, ns())


def test_the_negative_position_check_is_only_where_a_key_may_be_negative() -> None:
    def guarded(src: str) -> bool:
        return "IndexError" in accepted(src).chunk_source

    assert guarded("for i in range(k, n):\n    y[i] = y[i] * 2\n")
    assert guarded("for i in set(idx):\n    y[i] = y[i] * 2\n")
    assert guarded("for i in range(-2, n):\n    y[i] = 0\n    y[i] += 1\n")
    for header in (
        "for i in range(n):",
        "for i in range(1, n):",
        "for i in range(0, n, 2):",
        "for i in range(n - 1, -1, -1):",
        "for i, v in enumerate(vs):",
        "for i in ['a', 'b']:",
        "for i in y.keys():",
    ):
        assert not guarded(header + "\n    y[i] = y[i] * 2\n"), header


@pytest.mark.cluster
def test_set_keys_of_a_frame_by_label_and_of_a_series_by_position(ip, cluster):
    # a DataFrame's string labels pass the check
    cell = "for c in set(cols):\n    df[c] = df[c].fillna(df[c].mean())\n"
    assert_serial_equivalent(ip, cell, {"df": frame(), "cols": ["a", "b", "a"]})
    # a Series labelled by strings takes s[0] as its first element: refused
    s = pd.Series([1.0, 2.0], index=["a", "b"])
    ip.user_ns.update(s=s, ks=[0, "a"])
    with pytest.raises(IndexError, match="may name the element of another"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for k in set(ks):\n    s[k] = s[k] * 2\n"
        )
    assert ip.user_ns["s"] is s and s.tolist() == [1.0, 2.0]


def test_literal_keys_of_one_type_only() -> None:
    # mixed keys are a keyed reduction, checked against the object at run time
    # (test_keys_that_may_repeat_into_a_casting_store_are_refused)
    assert not analyse("for k in [0, 'a']:\n    s[k] = s[k] * 2\n").writes
    accepted("for k in ['a', 'b']:\n    s[k] = s[k] * 2\n")
    accepted("for k in (0, 2):\n    s[k] = s[k] * 2\n")


# -- a value written under the loop's variable, then read back ---------------------

READ_BACK = {
    "a score per model, logged": (
        "import math\n"
        "for lr in lrs:\n    final[lr] = math.exp(-lr) * 3\n"
        "    report.append('{:.3f}'.format(final[lr]))\n"
        "    print(lr, final[lr])\n",
        lambda: {"lrs": [0.1, 0.5, 1.0], "final": {}, "report": []},
    ),
    "keys that repeat: the last iteration's value stays": (
        "for k in ks:\n    d[k] = k * 2 + len(out)\n    out2.append(str(d[k]))\n",
        lambda: {"ks": [3, 1, 3, 2, 1], "d": {0: 0}, "out": [7], "out2": []},
    ),
    "an array made per key, read back": (
        "import numpy as np\n"
        "for name in names:\n    coefs[name] = np.polyfit(t, t * len(name), 1)\n"
        "    lead.append(float(np.round(coefs[name][0], 6)))\n",
        lambda: {
            "names": ["a", "bb", "ccc"],
            "t": np.linspace(0, 1, 7),
            "coefs": {},
            "lead": [],
        },
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(READ_BACK))
def test_a_value_written_then_read_back_matches_the_serial_run(ip, cluster, case):
    cell, ns = READ_BACK[case]
    plan = accepted(cell)
    assert [r.mode for r in plan.own_rows] == ["value"]
    assert_serial_equivalent(ip, cell, ns())


def test_a_value_from_outside_handed_on_stays_refused() -> None:
    # `f` could change `xs` itself, which an engine has a copy of
    assert refused("for k in ks:\n    d[k] = xs\n    f(d[k])\n")
    # read before the iteration writes it: an earlier iteration's value
    assert refused("for k in ks:\n    f(d[k])\n    d[k] = 1\n")


def test_what_a_handed_on_value_holds_is_checked_on_the_engines() -> None:
    # `f` could change `xs` through the list: the engines check `xs`
    p = accepted("for k in ks:\n    d[k] = [xs, 1]\n    f(d[k])\n")
    assert "xs" in dict(p.watch)
    (row,) = p.own_rows
    assert row.handed == (2,)


@pytest.mark.cluster
def test_a_function_changing_what_a_handed_on_value_holds_fails_unmerged(
    ip, cluster
) -> None:
    from gpucell.errors import InputChanged

    ip.run_cell("def grow(pair):\n    pair[0].append(1)\n").raise_error()
    xs, d = [0], {}
    ip.user_ns.update(xs=xs, d=d, ks=[1, 2])
    with pytest.raises(InputChanged):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for k in ks:\n    d[k] = [xs, k]\n    grow(d[k])\n",
        )
    assert ip.user_ns["xs"] is xs and xs == [0] and d == {}


# -- over the written mapping itself -----------------------------------------------

OVER_ITSELF = {
    "a dict's values by its own keys": (
        "for k in settings:\n    settings[k] = settings[k].upper()\n",
        lambda: {"settings": {"mode": "train", "device": "cpu", "opt": "adam"}},
    ),
    "sorted keys, read before the write": (
        "for k in sorted(d):\n    old = d[k]\n    d[k] = old * 2 + len(k)\n",
        lambda: {"d": {"b": 1, "a": 2, "c": 3}},
    ),
    "a frame by its columns": (
        "for c in df:\n    df[c] = df[c].astype(str).str.len()\n",
        lambda: {"df": frame()},
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(OVER_ITSELF))
def test_own_keys_of_the_written_mapping_match_the_serial_run(ip, cluster, case):
    cell, ns = OVER_ITSELF[case]
    accepted(cell)
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
def test_a_list_iterated_for_its_own_keys_fails_unmerged(ip, cluster) -> None:
    # `for k in y` gives a list's values, which may repeat: y[0] twice
    y = [0, 0, 1]
    ip.user_ns["y"] = y
    with pytest.raises(IndexError, match="holds only for a dict"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for k in y:\n    y[k] = y[k] + 5\n"
        )
    assert ip.user_ns["y"] is y and y == [0, 0, 1]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("cell", "ns"),
    [
        # y[-3] and y[0] are one element: it gets both contributions, as serially
        (
            "for i in range(-3, 3):\n    y[i] += 1\n",
            lambda: {"y": np.array([1.0, 2.0, 3.0])},
        ),
        ("for i in [-1, 2, 0]:\n    y[i] += 1\n", lambda: {"y": [1, 2, 3]}),
        (
            "for i, j in [(0, -1), (0, 1), (-2, 1)]:\n    m[i, j] += 1\n",
            lambda: {"m": np.zeros((2, 2), dtype=np.int64)},
        ),
    ],
)
def test_keyed_reduction_keys_that_name_one_element_fold_as_serially(
    ip, cluster, cell, ns
) -> None:
    assert_serial_equivalent(ip, cell, ns())


@pytest.mark.cluster
def test_keyed_reduction_over_slices_fails_unmerged(ip, cluster) -> None:
    """Slices of two iterations may overlap (serially the shared element gets
    both): refused at the merge, nothing merged."""
    y = np.array([1.0, 2.0, 3.0, 4.0])
    ip.user_ns["y"] = y
    with pytest.raises(NotParallelizable, match="not one position"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(3):\n    y[i:i + 2] += 1\n"
        )
    assert ip.user_ns["y"] is y and y.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.cluster
@pytest.mark.parametrize(
    "cell",
    [
        # each group writes its own rows: the groups were split from the frame
        # as it was when the loop began, serially as on the engines
        "df['share'] = 0.0\nfor name, g in df.groupby('g'):\n"
        "    df.loc[g.index, 'share'] = g['x'] / g['x'].sum()\n",
        # a later group would not see an earlier one's write even if it overlapped
        "for name, s in df.groupby('g')['x']:\n    df.loc[:, 'y'] = s.sum()\n",
    ],
    ids=["own-rows", "whole-column"],
)
def test_a_frame_written_while_iterating_its_groups_matches_the_serial_run(
    ip, cluster, cell
) -> None:
    """``df.groupby(..)`` splits its groups (a copy of the rows in group order)
    when iteration starts: writes to ``df`` in the body never reach a later
    group, so the frame is not a changed iterable."""
    df = pd.DataFrame({"g": list("abcab"), "x": [1.0, 2.0, 3.0, 4.0, 5.0]})
    df["y"] = 0.0
    assert_serial_equivalent(ip, cell, {"df": df})


def test_a_lazy_groupby_of_a_changed_list_stays_refused() -> None:
    """``itertools.groupby(queue)`` reads ``queue`` as the loop runs."""
    r = refused(
        "import itertools\nfor k, grp in itertools.groupby(queue):\n"
        "    queue.append(k)\n"
    )
    assert "iterates over `queue`" in r[("queue", "iterable-mutated")]


@pytest.mark.cluster
def test_a_key_that_is_not_one_position_is_named_by_its_source(ip, cluster) -> None:
    """The merge's refusal names the statement as written and the key by its
    source (`votes[va]`, rebinding `=` and `+`), never the key's value."""
    votes = np.zeros(6)
    ip.user_ns.update(votes=votes, splits=[np.arange(0, 6, 2), np.array([1, 2])])
    with pytest.raises(NotParallelizable) as e:
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for va in splits:\n    votes[va] = votes[va] + 1\n",
        )
    said = str(e.value)
    assert "`votes[va] = votes[va] + 1` (line 3): the key `va` is a `ndarray`" in said
    assert "array(" not in said and "+=" not in said
    assert ip.user_ns["votes"] is votes and not votes.any()
