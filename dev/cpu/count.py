"""Lines of each file as /work/shared/tools/weigh classifies them: code, docstring, comment."""
import importlib.machinery
import sys

weigh = importlib.machinery.SourceFileLoader("weigh", "/work/shared/tools/weigh").load_module()
for path in sys.argv[1:]:
    n = open(path).read().count("\n")
    print(f"{path:28} {n:5} lines", weigh.classify(path))
