#!/usr/bin/env python3
"""Compares detections (peregrine detect's JSON lines) of one run with others, image by
image: a pair matches when the class is the same, IoU >= 0.9 and the scores are within
0.02, one to one, best IoU first. Used for the GPU's parity with the CPU path.

    scripts/compare-detections.py REFERENCE.jsonl OTHER.jsonl...
"""
import json,sys
def load(p): return {json.loads(l)['image'].split('/')[-1]: json.loads(l)['detections'] for l in open(p) if l.strip()}
def iou(a,b):
    iw=max(0,min(a[2],b[2])-max(a[0],b[0])); ih=max(0,min(a[3],b[3])-max(a[1],b[1])); i=iw*ih
    u=(a[2]-a[0])*(a[3]-a[1])+(b[2]-b[0])*(b[3]-b[1])-i; return i/u if u>0 else 0
def match(x,y):
    pairs=sorted(((iou(a['box'],b['box']),i,j) for i,a in enumerate(x) for j,b in enumerate(y) if a['class_id']==b['class_id'] and abs(a['score']-b['score'])<=0.02 and iou(a['box'],b['box'])>=0.9),reverse=True)
    ua,ub,n=set(),set(),0
    for _,i,j in pairs:
        if i not in ua and j not in ub: ua.add(i); ub.add(j); n+=1
    return n
cpu=load(sys.argv[1])
for f in sys.argv[2:]:
    g=load(f)
    tc=sum(len(v) for v in cpu.values()); tg=sum(len(v) for v in g.values()); m=sum(match(cpu[k],g.get(k,[])) for k in cpu)
    print(f, 'cpu',tc,'gpu',tg,'matched',m, f'recall {m/tc:.4f} precision {m/tg:.4f}')
