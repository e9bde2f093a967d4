# Draws docs/img/memory-mlp/memory_fp16.png and .svg from docs/img/memory-mlp/memory_fp16.dat
set title "zeroshard MLP example: 64 -> 7 x 1024 -> 10, micro batch 32 - fp16" noenhanced
set xlabel 'world size (ranks)'
set ylabel 'model-state bytes per rank (MB)'
set xtics 1
set grid
set key outside right top
set yrange [0:*]
set terminal pngcairo size 960,560
set output 'docs/img/memory-mlp/memory_fp16.png'
plot 'docs/img/memory-mlp/memory_fp16.dat' index 0 using 1:2 with points pt 7 ps 1.4 lc 1 title 'stage 0 measured', \
     'docs/img/memory-mlp/memory_fp16.dat' index 0 using 1:3 with lines dt 2 lw 2 lc 1 title 'stage 0 theory', \
     'docs/img/memory-mlp/memory_fp16.dat' index 1 using 1:2 with points pt 7 ps 1.4 lc 2 title 'stage 1 measured', \
     'docs/img/memory-mlp/memory_fp16.dat' index 1 using 1:3 with lines dt 2 lw 2 lc 2 title 'stage 1 theory', \
     'docs/img/memory-mlp/memory_fp16.dat' index 2 using 1:2 with points pt 7 ps 1.4 lc 3 title 'stage 2 measured', \
     'docs/img/memory-mlp/memory_fp16.dat' index 2 using 1:3 with lines dt 2 lw 2 lc 3 title 'stage 2 theory', \
     'docs/img/memory-mlp/memory_fp16.dat' index 3 using 1:2 with points pt 7 ps 1.4 lc 4 title 'stage 3 measured', \
     'docs/img/memory-mlp/memory_fp16.dat' index 3 using 1:3 with lines dt 2 lw 2 lc 4 title 'stage 3 theory'
set terminal svg size 960,560 dynamic
set output 'docs/img/memory-mlp/memory_fp16.svg'
replot
set output
