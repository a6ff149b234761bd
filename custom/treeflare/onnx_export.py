"""ONNX exports, served by onnxruntime without treeflare: the global tree's scikit-learn pipeline through
``skl2onnx``, a federated XGBoost model through ``onnxmltools``. Pure core: no NVFlare, and no model module is
imported (the estimators are duck-typed), so ``GlobalTree``/``XGBModel`` may call in here.

The global tree's ONNX graph takes one input per schema feature, named as the column, shape (n, 1): numbers as
double (NaN = missing), categorical and ordinal columns as strings (a missing value is any string that is not a
category, e.g. ""). Outputs: ``label`` (class names) and ``probabilities`` (float32: onnxruntime's tree
ensemble classifier writes its scores in float32, whatever the input type). Two things skl2onnx does not carry
over are put right here: the ``Float32Snap`` encoder (a converter of the same arithmetic) and each split's
``missing_go_to_left`` (skl2onnx writes "a NaN goes to the false branch" for every node of a
``DecisionTreeClassifier``; this export sets ``nodes_missing_value_tracks_true`` from the tree, so NaN follows
the same branch as in scikit-learn). Thresholds: the tree ensemble holds float32 thresholds, which skl2onnx
chooses so that a float32 input compares as scikit-learn compares its float32 input with the float64
threshold; the snapped inputs are float32 values on the right side of every threshold, so the graph routes
every row as the global tree does (``tests/models/test_export_onnx.py`` checks thresholds that are no float32).

XGBoost: numeric features only. XGBoost's categorical splits (the job's categorical columns, ``feature_types``
"c") are sets of categories; onnxmltools 1.16 reads only "x < value" splits, so such a model is refused.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["OnnxExportError", "pipeline_to_onnx", "tree_onnx_inputs", "xgb_to_onnx", "run_onnx"]

TARGET_OPSET = 17
ML_OPSET = 3  # the most skl2onnx may use; its DecisionTreeClassifier converter writes TreeEnsembleClassifier v1
XGB_OPSET = 15  # the highest onnxmltools 1.16's XGBoost converter accepts


class OnnxExportError(ValueError):
    """The model cannot be exported to ONNX exactly; the message says why."""


# ---------------------------------------------------------------------------------------------- global tree
def _register_snap() -> None:
    from skl2onnx import update_registered_converter
    from skl2onnx.algebra.onnx_ops import OnnxCast, OnnxIsNaN, OnnxLessOrEqual, OnnxMax, OnnxMin, OnnxWhere
    from skl2onnx.common.data_types import FloatTensorType

    from .icdta4fl.sklearn_export import Float32Snap

    def shape(operator):
        operator.outputs[0].type = FloatTensorType([operator.inputs[0].type.shape[0], 1])

    def convert(scope, operator, container):
        op, opv = operator.raw_operator, container.target_opset
        x = OnnxCast(operator.inputs[0], to=11, op_version=opv)  # double
        z = OnnxCast(OnnxCast(x, to=1, op_version=opv), to=11, op_version=opv)  # rounded to float32
        for t, lo, hi in zip(np.asarray(op.thresholds, dtype=np.float64), op.lo_, op.hi_):
            below = OnnxLessOrEqual(x, np.array([t]), op_version=opv)
            z = OnnxWhere(below, OnnxMin(z, np.array([lo]), op_version=opv),
                          OnnxMax(z, np.array([hi]), op_version=opv), op_version=opv)
        z = OnnxWhere(OnnxIsNaN(x, op_version=opv), x, z, op_version=opv)
        # float32 out: every value is a float32 by construction, and the tree ensemble reads float32
        out = OnnxCast(z, to=1, op_version=opv, output_names=operator.outputs[:1])
        out.add_to(scope, container)

    update_registered_converter(Float32Snap, "TreeflareFloat32Snap", shape, convert)


def _initial_types(schema, pipeline):
    """One input per feature: strings for categories; numbers as double where the pipeline snaps them
    (``Float32Snap``: exact for any double), float where it passes them through (``portable``: scikit-learn
    rounds them to float32 itself, so float inputs give what it gives)."""
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType, StringTensorType

    from .icdta4fl.sklearn_export import Float32Snap

    encoder = pipeline.steps[0][1]
    snapped = {cols[0] for _, step, cols in encoder.transformers_ if isinstance(step, Float32Snap)}
    return [(f.name, StringTensorType([None, 1]) if f.kind != "numeric" else
             DoubleTensorType([None, 1]) if f.name in snapped else FloatTensorType([None, 1]))
            for f in schema.features]


def _set_missing_tracks(onx, sk_tree) -> int:
    """Copy each split's ``missing_go_to_left`` into the graph's tree ensemble; returns the nodes changed."""
    from onnx import helper

    ensembles = [n for n in onx.graph.node if n.op_type == "TreeEnsembleClassifier"]
    if len(ensembles) != 1:
        raise OnnxExportError(f"expected one TreeEnsembleClassifier in the converted graph, found {len(ensembles)}")
    node = ensembles[0]
    attrs = {a.name: a for a in node.attribute}
    ids = list(helper.get_attribute_value(attrs["nodes_nodeids"]))
    modes = [m.decode() if isinstance(m, bytes) else m for m in helper.get_attribute_value(attrs["nodes_modes"])]
    left = sk_tree.missing_go_to_left
    tracks = [int(bool(left[i])) if mode != "LEAF" else 0 for i, mode in zip(ids, modes)]
    node.attribute.remove(attrs["nodes_missing_value_tracks_true"])
    node.attribute.append(helper.make_attribute("nodes_missing_value_tracks_true", tracks))
    return int(sum(tracks))


def _float_probabilities(onx) -> None:
    """skl2onnx declares the tree's outputs in the type of the first input (double here), but the tree ensemble
    classifier writes float32 scores: the declared output type is made what onnxruntime produces."""
    for out in onx.graph.output:
        if out.type.tensor_type.elem_type == 11:  # double
            out.type.tensor_type.elem_type = 1


def _refuse_float32_ties(clf) -> None:
    """onnxruntime picks the label from its float32 scores (the first class on a tie), the global tree from
    float64 probabilities: a leaf whose best class differs between the two would label its rows differently
    (e.g. counts [10, 1e8, 1e8 + 3]), so such a tree is refused, naming the leaf."""
    tree = clf.tree_
    values = tree.value[:, 0, :]
    leaves = np.nonzero(tree.children_left < 0)[0]
    wide, narrow = np.argmax(values[leaves], axis=1), np.argmax(values[leaves].astype(np.float32), axis=1)
    bad = np.nonzero(wide != narrow)[0]
    if bad.size:
        leaf = int(leaves[bad[0]])
        source = getattr(clf, "treeflare_nodes_", None)
        ours = f"node {int(source[leaf])} of the global tree" if source is not None else "a node"
        raise OnnxExportError(
            f"{ours} (scikit-learn leaf {leaf}; {bad.size} such leaves in all): its top two class probabilities "
            "are equal in float32 but distinct in float64, and onnxruntime picks the label from float32 scores "
            "(the first class on a tie), so ONNX would label its rows differently; use the scikit-learn export")


def pipeline_to_onnx(pipeline, schema):
    """The ONNX model (``onnx.ModelProto``) of a pipeline made by ``icdta4fl.sklearn_export.to_sklearn``, inputs named as
    the schema's features. Refused (``OnnxExportError``) where a leaf's best class is a float32 tie
    (``_refuse_float32_ties``)."""
    from skl2onnx import convert_sklearn

    _register_snap()
    clf = pipeline.steps[-1][1]
    _refuse_float32_ties(clf)
    onx = convert_sklearn(pipeline, "treeflare_global_tree", initial_types=_initial_types(schema, pipeline),
                          options={id(clf): {"zipmap": False}},
                          target_opset={"": TARGET_OPSET, "ai.onnx.ml": ML_OPSET})
    _set_missing_tracks(onx, clf.tree_)
    _float_probabilities(onx)
    inputs = [i.name for i in onx.graph.input]
    if len(inputs) != len(schema.features):
        raise OnnxExportError(f"the converted graph has {len(inputs)} inputs for {len(schema.features)} features")
    # skl2onnx writes a column name with characters other than letters, digits and _ as a changed name (e.g.
    # "education-num" -> "education_num"): the graph says which input is which column
    _set_metadata(onx, {INPUTS_KEY: json.dumps(dict(zip(inputs, schema.feature_names))),
                        "treeflare_model": "icdta4fl global tree"})
    return onx


INPUTS_KEY = "treeflare_inputs"


def _set_metadata(onx, values: dict) -> None:
    for key, value in values.items():
        entry = onx.metadata_props.add()
        entry.key, entry.value = key, value


def input_columns(onx) -> dict:
    """Graph input name -> the schema column it reads (from the model's metadata)."""
    meta = {p.key: p.value for p in onx.metadata_props}
    return json.loads(meta[INPUTS_KEY]) if INPUTS_KEY in meta else {i.name: i.name for i in onx.graph.input}


def tree_onnx_inputs(onx, frame) -> dict:
    """onnxruntime's feed for the global tree's graph ``onx`` from a DataFrame of raw values (as ``to_sklearn``'s
    pipeline takes them): each input column in the graph's type (double or float numbers, NaN = missing;
    categories as strings, missing as "")."""
    import pandas as pd

    feeds = {}
    columns = input_columns(onx)
    for inp in onx.graph.input:
        col = frame[columns[inp.name]]
        elem = inp.type.tensor_type.elem_type
        if elem in (1, 11):  # float, double
            values = pd.to_numeric(col).to_numpy(dtype=np.float64)
            feeds[inp.name] = values.astype(np.float32 if elem == 1 else np.float64).reshape(-1, 1)
        else:
            text = col.astype(object).where(col.notna(), "").astype(str)
            feeds[inp.name] = text.to_numpy(dtype=object).reshape(-1, 1)
    return feeds


def run_onnx(onx, feeds) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities) from onnxruntime for ``onx`` (a ModelProto, bytes or a path)."""
    import onnxruntime as ort

    data = onx.SerializeToString() if hasattr(onx, "SerializeToString") else onx
    session = ort.InferenceSession(data if isinstance(data, bytes) else str(data), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, feeds)))
    label = next(v for k, v in out.items() if "label" in k)
    proba = next(v for k, v in out.items() if "prob" in k)
    return np.asarray(label), np.asarray(proba)


# ---------------------------------------------------------------------------------------------- XGBoost
def xgb_to_onnx(model):
    """The ONNX model of an ``XGBModel`` (booster with its schema): one float input ``input`` of shape
    (n, n_features), the schema's features as the job encodes them (NaN = missing); outputs ``label`` (the
    class index) and ``probabilities``. Refused for models with categorical features."""
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    schema, booster = model.data_schema, model.booster
    categorical = [f.name for f in schema.features if f.kind == "categorical"]
    types = list(booster.feature_types or [])
    if categorical or "c" in types:
        raise OnnxExportError(
            f"this XGBoost model has categorical features {categorical or 'typed c'}: XGBoost splits them by sets "
            "of categories, which onnxmltools 1.16's converter cannot express (it writes only 'x < value' splits); "
            "train on numeric (or ordinal) columns for an ONNX export, or use the model with XGBoost")
    config = json.loads(booster.save_config())["learner"]
    if config["gradient_booster"]["name"] != "gbtree":
        raise OnnxExportError(f"booster {config['gradient_booster']['name']!r}: only gbtree converts")
    n = len(schema.features)
    clone = booster.copy()
    clone.feature_names = None  # onnxmltools reads split features as f<index>
    clone.feature_types = None
    try:
        onx = convert_xgboost(clone, "treeflare_xgboost", initial_types=[("input", FloatTensorType([None, n]))],
                               target_opset=XGB_OPSET)
    except Exception as exc:  # the converter's own refusal, in its words
        raise OnnxExportError(f"onnxmltools cannot convert this model: {type(exc).__name__}: {exc}") from None
    _set_metadata(onx, {"treeflare_model": "xgboost", "treeflare_features": json.dumps(schema.feature_names),
                        "treeflare_classes": json.dumps(list(schema.classes))})
    return onx
