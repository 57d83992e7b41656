"""The suite without an optional package of the ``test`` extra (issue #45): each test runs if it does not
need the package, or skips saying which it needs; none fails because one is missing. The whole suite
without each package is ``python tools/optional_packages.py``; here, per package, a fresh pytest with that
package hidden runs tests that need only others (they must pass: a pair-mode test once failed with a
NameError without PyAV) and tests that need it (they must skip, naming it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from conftest import OPTIONAL_PACKAGES, missing_packages

REPO = Path(__file__).resolve().parent.parent
INTERPOLATE, MODELS, EXPORT = "tests/test_interpolate.py::", "tests/test_models.py::", "tests/test_export.py::"
PAIR_ERRORS = INTERPOLATE + "test_cli_pair_errors_are_one_line_with_exit_code_2"  # Pillow only
# package hidden -> (tests that must pass without it, tests that must skip naming it)
CASES = {
    "av": ([PAIR_ERRORS, INTERPOLATE + "test_write_image_round_trip_and_rounding"],
           [INTERPOLATE + "test_no_scene_detect_interpolates_across_the_cut"]),
    "PIL": ([INTERPOLATE + "test_the_queues_are_bounded", MODELS + "test_train_checkpoint_writes_are_atomic"],
            [PAIR_ERRORS, MODELS + "test_train_bad_input_is_one_line_and_exit_code_2"]),
    "tqdm": ([PAIR_ERRORS, MODELS + "test_train_bad_input_is_one_line_and_exit_code_2"],
             [MODELS + "test_train_epochs_bar_counts_epochs_times_batches"]),
    "skimage": ([PAIR_ERRORS], [INTERPOLATE + "test_metrics_equal_scikit_image"]),
    "onnx": ([INTERPOLATE + "test_the_queues_are_bounded"], [EXPORT + "test_onnx_rejects_old_opset"]),
    "onnxscript": ([INTERPOLATE + "test_the_queues_are_bounded"], [EXPORT + "test_onnx_rejects_old_opset"]),
    "onnxruntime": ([INTERPOLATE + "test_the_queues_are_bounded"], [EXPORT + "test_onnx_rejects_old_opset"]),
}


def tool():
    spec = importlib.util.spec_from_file_location("optional_packages", REPO / "tools" / "optional_packages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cases_cover_every_optional_package_of_the_test_extra():
    assert set(CASES) == set(OPTIONAL_PACKAGES) == set(tool().PACKAGES)
    extra = (REPO / "pyproject.toml").read_text().split("\ntest = [", 1)[1].split("]", 1)[0]
    names = {re.split(r"[<>=!~ ]", name.strip().strip('"'))[0] for name in extra.replace("\n", "").split(",")}
    assert {OPTIONAL_PACKAGES[m] for m in OPTIONAL_PACKAGES} <= names


@pytest.mark.parametrize("package", CASES)
def test_without_the_package_tests_run_or_skip_naming_it(package):
    run, skip = CASES[package]
    others = missing_packages(*{m for m in OPTIONAL_PACKAGES if m != package})
    if others:
        pytest.skip(f"needs the other optional packages to tell what hiding {package} does ({', '.join(others)} "
                    "missing)")
    row = tool().run_without(package, [*run, *skip])
    assert (row["failed"], row["errors"], row["problems"]) == (0, 0, []), row["tail"]
    assert (row["passed"], row["skipped for it"], row["skipped otherwise"]) == (len(run), len(skip), 0), row["tail"]
