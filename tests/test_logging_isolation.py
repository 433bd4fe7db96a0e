"""A logger made under ``capsys`` does not outlive its test (tests/conftest.py, ``_no_stale_logger``)."""
import sys

from mmengine.logging import MMLogger, print_log


def test_a_logger_made_under_capsys(capsys):
    logger = MMLogger.get_instance('made_under_capsys')
    assert any(getattr(h, 'stream', None) is sys.stdout for h in logger.handlers)  # this test's capture
    print_log('to the capture', logger='current')
    assert 'to the capture' in capsys.readouterr().out


def test_the_next_test_logs_to_open_streams():
    """The capture of the test above is closed now; the latest logger writes to streams that are open."""
    logger = MMLogger.get_current_instance()
    streams = [h.stream for h in logger.handlers if hasattr(h, 'stream')]
    assert streams and not any(s.closed for s in streams), streams
