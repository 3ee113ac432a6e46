"""Research on ldlm's models: training the demo model (research.train) and the
sampling-quality measurements (research.samplers, research.infill, with the C++
programs sampler_eval.cpp and infill_eval.cpp). Speed lives in bench/, what users run
in tools/.

Run the modules from the repository root with tools/ on the path (the reference
package), e.g. `PYTHONPATH=tools /usr/bin/python3 -m research.train.evaluate --help`.
"""
