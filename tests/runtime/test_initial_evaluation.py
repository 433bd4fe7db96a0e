"""InitialEvaluationHook (mmpola.runtime.initial_evaluation): the untrained model's metrics before training,
the latest after; nothing when the run resumes."""
from mmpola.runtime import InitialEvaluationHook


def test_initial_evaluation_hook_records_before_and_after():
    class Loop:
        def run(self):
            return {'coco/bbox_mAP': 0.01}

    class Runner:
        _resume, iter, val_loop = False, 0, Loop()

        class logger:
            info = staticmethod(print)

    hook = InitialEvaluationHook()
    hook.before_train(Runner())
    hook.after_val_epoch(Runner(), {'coco/bbox_mAP': 0.5})
    assert hook.initial_metrics == {'coco/bbox_mAP': 0.01} and hook.last_metrics == {'coco/bbox_mAP': 0.5}
    resumed = Runner()
    resumed._resume = True
    hook = InitialEvaluationHook()
    hook.before_train(resumed)
    assert hook.initial_metrics is None
