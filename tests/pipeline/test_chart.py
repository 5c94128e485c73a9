"""The stage picture: the schedule's chart as text and, with ``png=``, as an image."""

from __future__ import annotations

import jax
import numpy as np

import partitioner

from .test_pipeline_costs import layer, params_of


def test_the_chart_draws_the_text_as_a_picture(mesh, tmp_path) -> None:
    params, x = params_of(), np.ones((32, 64), np.float32)
    run = partitioner.pipeline(layer, axis="stage", microbatches=4, schedule="circular")
    with jax.set_mesh(mesh((4, 2), ("stage", "data"))):
        plan = run.plan(params, x)
    path = tmp_path / "schedule.png"
    text = plan.chart(png=str(path))
    assert text == plan.chart()  # the picture changes nothing of the text
    # the forwards, then the backward loop's steps in reverse (two columns each)
    assert text.splitlines()[3].startswith("stage 3 |   .   .   . F0a F1a F2a F3a F0b F1b")
    assert "B3b B3b B2b B2b" in text.splitlines()[3]
    import matplotlib.image

    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert width > 2 * height  # 33 steps across, 4 stages down
    # a busy cell is coloured, a bubble cell white: the picture is not blank
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 8
